//! Session configuration: which streams exist and which groups each logs.
//!
//! A session has one or more streams. A `normal` stream writes everything it
//! logs to the file; a `ring` stream is a flight recorder that keeps the most
//! recent records of each thread in memory and writes them only when a trigger
//! fires. Each stream logs the groups its patterns select (`*` wildcards, `!`
//! to exclude, later patterns win). The configuration comes from, in order:
//! the caller, the TOML file named by `LOOPSCOPE_CONFIG`, or the default (one
//! normal stream `main` logging every group); `LOOPSCOPE_GROUPS` then replaces
//! the groups of the first normal stream and `LOOPSCOPE_RING_GROUPS` those of
//! the first ring stream, adding a ring stream `ring` when there is none;
//! `LOOPSCOPE_WRITER_IDLE=1` (or `0`) sets `writer_idle`.

use crate::Error;
use serde::Deserialize;

pub const MAX_STREAMS: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StreamKind {
    Normal,
    Ring,
}

impl StreamKind {
    pub fn as_str(self) -> &'static str {
        match self {
            StreamKind::Normal => "normal",
            StreamKind::Ring => "ring",
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamConfig {
    pub name: String,
    #[serde(default = "normal")]
    pub kind: StreamKind,
    #[serde(default = "all_groups")]
    pub groups: Vec<String>,
    /// Per-thread buffer in KiB; rounded up to whole 64 KiB blocks.
    #[serde(default)]
    pub buffer_kib: Option<u64>,
}

fn normal() -> StreamKind {
    StreamKind::Normal
}
fn all_groups() -> Vec<String> {
    vec!["*".into()]
}

impl StreamConfig {
    pub fn buffer_bytes(&self) -> u64 {
        let kib = self.buffer_kib.unwrap_or(match self.kind {
            StreamKind::Normal => 8192,
            StreamKind::Ring => 1024,
        });
        let b = kib * 1024;
        let blocks = b.div_ceil(crate::format::BLOCK).max(4);
        blocks.next_power_of_two() * crate::format::BLOCK
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default = "default_streams", rename = "stream")]
    pub streams: Vec<StreamConfig>,
    /// How often the writer drains the buffers when they are quiet, in ms.
    #[serde(default = "default_flush_ms")]
    pub flush_ms: u64,
    /// fsync the file at close.
    #[serde(default)]
    pub fsync: bool,
    /// Run the writer at SCHED_IDLE: it then runs only when its CPU has
    /// nothing else to do, and any thread woken there takes the CPU from it
    /// at once (loopscope's own probes ask for it: their writer must not
    /// delay what other probes measure). Under a CPU that never idles it
    /// falls behind, and what overflows the buffers is counted as lost.
    #[serde(default)]
    pub writer_idle: bool,
}

fn default_streams() -> Vec<StreamConfig> {
    vec![StreamConfig { name: "main".into(), kind: StreamKind::Normal, groups: all_groups(), buffer_kib: None }]
}
fn default_flush_ms() -> u64 {
    10
}

impl Default for Config {
    fn default() -> Self {
        Config { streams: default_streams(), flush_ms: default_flush_ms(), fsync: false, writer_idle: false }
    }
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

impl Config {
    /// Parse TOML text; `origin` names the file in errors.
    pub fn from_toml(text: &str, origin: &str) -> Result<Config, Error> {
        let c: Config = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| line_of(text, s.start)).unwrap_or(0);
            let msg = e.message().trim().to_string();
            Error::input(format!("{origin}:{line}: {msg}"))
        })?;
        c.validate(origin)?;
        Ok(c)
    }

    pub fn validate(&self, origin: &str) -> Result<(), Error> {
        if self.streams.is_empty() {
            return Err(Error::input(format!("{origin}: at least one [[stream]] is needed")));
        }
        if self.streams.len() > MAX_STREAMS {
            return Err(Error::input(format!("{origin}: at most {MAX_STREAMS} streams [got {}]", self.streams.len())));
        }
        for (i, s) in self.streams.iter().enumerate() {
            if s.name.is_empty() || self.streams[..i].iter().any(|o| o.name == s.name) {
                return Err(Error::input(format!("{origin}: stream.{i}.name: must be unique and non-empty [got {:?}]", s.name)));
            }
            if let Some(k) = s.buffer_kib {
                if !(64..=1 << 22).contains(&k) {
                    return Err(Error::input(format!("{origin}: stream.{i}.buffer_kib: must be 64..4194304 [got {k}]")));
                }
            }
        }
        if self.flush_ms == 0 || self.flush_ms > 10_000 {
            return Err(Error::input(format!("{origin}: flush_ms: must be 1..10000 [got {}]", self.flush_ms)));
        }
        Ok(())
    }

    /// The configuration from the environment (see the module text).
    pub fn from_env() -> Result<Config, Error> {
        let mut c = match std::env::var("LOOPSCOPE_CONFIG") {
            Ok(path) if !path.is_empty() => {
                let text = std::fs::read_to_string(&path).map_err(|e| Error::input(format!("LOOPSCOPE_CONFIG={path}: cannot read: {e}")))?;
                Config::from_toml(&text, &path)?
            }
            _ => Config::default(),
        };
        c.apply_env_groups();
        // the lab asks for an idle writer in the programs it runs as probes
        match std::env::var("LOOPSCOPE_WRITER_IDLE").as_deref() {
            Ok("1") => c.writer_idle = true,
            Ok("0") => c.writer_idle = false,
            _ => {}
        }
        c.validate("environment")?;
        Ok(c)
    }

    /// Apply `LOOPSCOPE_GROUPS` / `LOOPSCOPE_RING_GROUPS`.
    pub fn apply_env_groups(&mut self) {
        let split = |v: String| v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect::<Vec<_>>();
        if let Ok(v) = std::env::var("LOOPSCOPE_GROUPS") {
            if let Some(s) = self.streams.iter_mut().find(|s| s.kind == StreamKind::Normal) {
                s.groups = split(v);
            }
        }
        if let Ok(v) = std::env::var("LOOPSCOPE_RING_GROUPS") {
            let groups = split(v);
            match self.streams.iter_mut().find(|s| s.kind == StreamKind::Ring) {
                Some(s) => s.groups = groups,
                None => self.streams.push(StreamConfig { name: "ring".into(), kind: StreamKind::Ring, groups, buffer_kib: None }),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_file_declares_normal_and_ring_streams() {
        let c = Config::from_toml(
            "flush_ms = 5\n[[stream]]\nname = \"main\"\ngroups = [\"timer\"]\n[[stream]]\nname = \"flight\"\nkind = \"ring\"\nbuffer_kib = 256\n",
            "t.toml",
        )
        .unwrap();
        assert_eq!(c.streams.len(), 2);
        assert_eq!(c.streams[1].kind, StreamKind::Ring);
        assert_eq!(c.streams[1].buffer_bytes(), 256 * 1024);
        assert_eq!(c.flush_ms, 5);
    }

    #[test]
    fn config_errors_name_the_file_and_line() {
        let e = Config::from_toml("[[stream]]\nname = \"a\"\nkind = \"circular\"\n", "x.toml").err().unwrap();
        assert!(e.to_string().starts_with("x.toml:3:"), "{e}");
        let e = Config::from_toml("[[stream]]\nname = \"a\"\nbogus = 1\n", "x.toml").err().unwrap();
        assert!(e.to_string().contains("x.toml:3"), "{e}");
    }

    #[test]
    fn buffers_are_whole_power_of_two_block_counts() {
        let s = StreamConfig { name: "a".into(), kind: StreamKind::Normal, groups: vec![], buffer_kib: Some(100) };
        assert_eq!(s.buffer_bytes(), 4 * 64 * 1024);
        let s = StreamConfig { buffer_kib: Some(1000), ..s };
        assert_eq!(s.buffer_bytes(), 16 * 64 * 1024);
    }
}
