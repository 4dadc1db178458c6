#!/usr/bin/env bash
# A tree of an earlier commit, runnable beside this one, for an A/B measurement.
#
#   scripts/ab-tree.sh COMMIT DIR
#   env PYTHONPATH=DIR/python .venv/bin/python -m loopscope.cli ...   # the earlier tree
#   .venv/bin/loopscope ...                                            # this tree
#
# DIR becomes a git worktree of COMMIT with its own compiled module, built in a
# target directory of its own (target/ab): built into this tree's target/ it
# would overwrite target/release/lib_native.so, and the next `make build` here,
# finding its own build fresh, would install that earlier module into this tree.
# The earlier tree uses this tree's .venv (its Python packages), so COMMIT must
# lock the same ones. Its bytecode is compiled once (a process started with
# PYTHONDONTWRITEBYTECODE would compile every module at every start otherwise).
# Remove it with `git worktree remove --force DIR`.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -ne 2 ]; then
	echo "usage: scripts/ab-tree.sh COMMIT DIR" >&2
	exit 2
fi
commit=$1 dir=$2
if ! git rev-parse --verify --quiet "$commit^{commit}" > /dev/null; then
	echo "ab-tree: $commit is not a commit of this repository" >&2
	exit 2
fi
if [ -e "$dir" ]; then
	echo "ab-tree: $dir exists; remove it first (git worktree remove --force $dir)" >&2
	exit 2
fi
py=$PWD/.venv/bin/python
test -x "$py" || { echo "ab-tree: no .venv here; run 'make build' first" >&2; exit 2; }
git worktree add --quiet --detach "$dir" "$commit"
zstd=()
pkg-config --exists libzstd 2> /dev/null && zstd=(ZSTD_SYS_USE_PKG_CONFIG=1)
echo "ab-tree: building $commit's loopscope._native in target/ab …" >&2
env "${zstd[@]}" CARGO_TARGET_DIR="$PWD/target/ab" PYO3_PYTHON="$py" PYO3_BUILD_EXTENSION_MODULE=1 \
	cargo rustc --quiet --profile release --manifest-path "$dir/crates/py/Cargo.toml" --lib
ext=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
cp target/ab/release/lib_native.so "$dir/python/loopscope/_native$ext"
# the C library and header the package carries (a C program's link), as this tree built them
if [ -d python/loopscope/_c ]; then cp -r python/loopscope/_c "$dir/python/loopscope/"; fi
"$py" -m compileall -q "$dir/python/loopscope" > /dev/null
if cmp -s "$dir/python/loopscope/_native$ext" "python/loopscope/_native$ext"; then
	echo "ab-tree: note: $commit's compiled module is byte for byte this tree's" >&2
fi
echo "ab-tree: ready: env PYTHONPATH=$dir/python $py -m loopscope.cli ..." >&2
