//! The i/o loads: a 1 MiB file copied in 100-byte blocks, and a build-like mix.
//!
//! `io` copies its own 1 MiB source file to a destination, 100 bytes per
//! read and per write (about 21,000 system calls a unit), optionally with an
//! fsync of the copy, as in Carlinet et al. 2000. `mix` alternates a compiler-like CPU
//! burst (twenty Huffman codings) with reading a 256 KiB "source", writing a
//! 64 KiB "object" and, every tenth step, fsyncing and deleting objects.
//! Files live in a directory of the worker's own, removed when it stops.

use crate::cpu::{CpuWork, Huffman};
use crate::error::{LoadError, Result};
use crate::{Rng, Work};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

fn private_dir(parent: &Path, tag: &str) -> Result<PathBuf> {
    let d = parent.join(format!("{tag}-{}", std::process::id()));
    fs::create_dir_all(&d).map_err(LoadError::file(&d, "cannot create the load's directory"))?;
    Ok(d)
}

fn random_file(path: &Path, size: usize, seed: u64) -> Result<()> {
    let mut r = Rng::new(seed);
    let data: Vec<u8> = (0..size).map(|_| r.next() as u8).collect();
    fs::write(path, data).map_err(LoadError::file(path, "cannot write"))
}

pub(crate) struct IoWork {
    dir: PathBuf,
    src: PathBuf,
    dst: PathBuf,
    fsync: bool,
    buf: [u8; 100],
}

impl IoWork {
    pub fn new(parent: &Path, fsync: bool) -> Result<IoWork> {
        let dir = private_dir(parent, "io")?;
        let src = dir.join("src.bin");
        random_file(&src, 1 << 20, 11)?;
        Ok(IoWork { dst: dir.join("dst.bin"), src, dir, fsync, buf: [0; 100] })
    }
}

impl Work for IoWork {
    fn step(&mut self) -> Result<u64> {
        let mut s = File::open(&self.src).map_err(LoadError::file(&self.src, "cannot open"))?;
        let mut d = OpenOptions::new().write(true).create(true).truncate(true).open(&self.dst).map_err(LoadError::file(&self.dst, "cannot open"))?;
        loop {
            let n = s.read(&mut self.buf).map_err(LoadError::file(&self.src, "cannot read"))?;
            if n == 0 {
                break;
            }
            d.write_all(&self.buf[..n]).map_err(LoadError::file(&self.dst, "cannot write"))?;
        }
        if self.fsync {
            d.sync_data().map_err(LoadError::file(&self.dst, "cannot sync"))?;
        }
        Ok(1)
    }
}

impl Drop for IoWork {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

pub(crate) struct MixWork {
    dir: PathBuf,
    src: PathBuf,
    cpu: CpuWork,
    h: Huffman,
    n: u64,
}

impl MixWork {
    pub fn new(parent: &Path) -> Result<MixWork> {
        let dir = private_dir(parent, "mix")?;
        let src = dir.join("source.c");
        random_file(&src, 256 << 10, 13)?;
        Ok(MixWork { dir, src, cpu: CpuWork::new(), h: Huffman::new(), n: 0 })
    }
}

impl Work for MixWork {
    fn step(&mut self) -> Result<u64> {
        let src = fs::read(&self.src).map_err(LoadError::file(&self.src, "cannot read"))?;
        for chunk in src.chunks(12_800).take(20) {
            std::hint::black_box(self.h.encode(chunk));
        }
        self.cpu.step()?;
        let obj = self.dir.join(format!("obj-{}.o", self.n % 10));
        let mut f = File::create(&obj).map_err(LoadError::file(&obj, "cannot create"))?;
        f.write_all(&src[..64 << 10]).map_err(LoadError::file(&obj, "cannot write"))?;
        self.n += 1;
        if self.n % 10 == 0 {
            f.sync_data().map_err(LoadError::file(&obj, "cannot sync"))?;
            for i in 0..10 {
                let _ = fs::remove_file(self.dir.join(format!("obj-{i}.o")));
            }
        }
        Ok(1)
    }
}

impl Drop for MixWork {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}
