//! Entities: the named instrumentation points records refer to.
//!
//! An entity is a two-level name (group/name) with a kind and a description,
//! registered once and then referred to by a small numeric id in every record;
//! the file carries the table from id to name (the Datastreams namespace).
//! Registration hands back a `&'static Entity` that lives for the rest of the
//! process. Its first field is the mask of streams that currently log it: the
//! hot path reads that one word and returns when it is zero, which is what a
//! disabled instrumentation point costs (the C header inlines the same check).
//!
//! Which streams log an entity follows from its group: each stream of the open
//! session has group patterns from its configuration, and run-time switches
//! override them per group. Both live here under one lock together with the
//! registry, so a mask is always recomputed from one consistent view.

use crate::format::{EntityInfo, Kind};
use crate::hist::{Histogram, Scale};
use crate::Error;
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::sync::Mutex;

/// A registered instrumentation point.
#[repr(C)]
pub struct Entity {
    /// Bit s set: stream s of the open session logs this entity. Must stay the
    /// first field: `include/loopscope.h` reads it inline.
    pub(crate) mask: AtomicU32,
    pub(crate) id: u32,
    pub(crate) kind: Kind,
    pub(crate) counter: AtomicI64,
    pub(crate) hist: Option<Histogram>,
    pub(crate) group: String,
    pub(crate) name: String,
    pub(crate) desc: String,
}

impl Entity {
    pub fn id(&self) -> u32 {
        self.id
    }
    pub fn kind(&self) -> Kind {
        self.kind
    }
    pub fn group(&self) -> &str {
        &self.group
    }
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn desc(&self) -> &str {
        &self.desc
    }
    /// Whether any stream logs this entity now.
    #[inline(always)]
    pub fn enabled(&self) -> bool {
        self.mask.load(Ordering::Relaxed) != 0
    }
    pub fn histogram(&self) -> Option<&Histogram> {
        self.hist.as_ref()
    }
    pub fn counter_value(&self) -> i64 {
        self.counter.load(Ordering::Relaxed)
    }
    pub(crate) fn info(&self) -> EntityInfo {
        EntityInfo {
            id: self.id,
            group: self.group.clone(),
            name: self.name.clone(),
            kind: self.kind,
            desc: self.desc.clone(),
            histogram: self.hist.as_ref().map(|h| h.scale),
        }
    }
}

/// Group selection of one stream: configured patterns plus run-time overrides.
#[derive(Clone, Debug, Default)]
pub(crate) struct StreamFilter {
    pub patterns: Vec<String>,
    pub overrides: HashMap<String, bool>,
}

impl StreamFilter {
    pub fn enables(&self, group: &str) -> bool {
        if let Some(&on) = self.overrides.get(group) {
            return on;
        }
        let mut on = false;
        for p in &self.patterns {
            if let Some(neg) = p.strip_prefix('!') {
                if glob(neg, group) {
                    on = false;
                }
            } else if glob(p, group) {
                on = true;
            }
        }
        on
    }
}

/// Shell-style match where `*` matches any run of characters.
pub(crate) fn glob(pat: &str, s: &str) -> bool {
    let (p, s) = (pat.as_bytes(), s.as_bytes());
    let (mut i, mut j, mut star, mut mark) = (0, 0, usize::MAX, 0);
    while j < s.len() {
        if i < p.len() && p[i] != b'*' && p[i] == s[j] {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == b'*' {
            star = i;
            mark = j;
            i += 1;
        } else if star != usize::MAX {
            i = star + 1;
            mark += 1;
            j = mark;
        } else {
            return false;
        }
    }
    while i < p.len() && p[i] == b'*' {
        i += 1;
    }
    i == p.len()
}

pub(crate) struct Control {
    pub entities: Vec<&'static Entity>,
    by_name: HashMap<(String, String), &'static Entity>,
    /// One filter per stream of the open session; empty when none is open.
    pub filters: Vec<StreamFilter>,
}

impl Control {
    fn mask_for(&self, group: &str) -> u32 {
        let mut m = 0;
        for (s, f) in self.filters.iter().enumerate() {
            if f.enables(group) {
                m |= 1 << s;
            }
        }
        m
    }

    /// Recompute every entity's mask (session opened or closed).
    pub fn remask_all(&self) {
        for e in &self.entities {
            e.mask.store(self.mask_for(&e.group), Ordering::Relaxed);
        }
    }

    pub fn remask_group(&self, group: &str) {
        let m = self.mask_for(group);
        for e in self.entities.iter().filter(|e| e.group == group) {
            e.mask.store(m, Ordering::Relaxed);
        }
    }
}

pub(crate) static CONTROL: std::sync::LazyLock<Mutex<Control>> =
    std::sync::LazyLock::new(|| Mutex::new(Control { entities: Vec::new(), by_name: HashMap::new(), filters: Vec::new() }));

pub(crate) fn control() -> std::sync::MutexGuard<'static, Control> {
    CONTROL.lock().unwrap_or_else(|e| e.into_inner())
}

fn check_name(what: &str, s: &str) -> Result<(), Error> {
    if s.is_empty() || s.len() > 200 || s.contains('/') || s.chars().any(|c| c.is_control()) {
        return Err(Error::input(format!("entity {what} {s:?} is not valid; use 1..200 printable characters without '/'")));
    }
    Ok(())
}

/// Register (or look up) the entity `group/name`. Registering an existing name
/// again returns the same entity when the kind (and histogram layout) agree.
pub fn register(group: &str, name: &str, kind: Kind, desc: &str, scale: Option<Scale>) -> Result<&'static Entity, Error> {
    check_name("group", group)?;
    check_name("name", name)?;
    let scale = match (kind, scale) {
        (Kind::Histogram, None) => Some(Scale::Log { sub_bits: 7, max: 1 << 40 }),
        (Kind::Histogram, s) => s,
        (_, Some(_)) => return Err(Error::input(format!("{group}/{name}: a bucket layout only applies to histograms, not to a {}", kind.as_str()))),
        (_, None) => None,
    };
    crate::clock::kind();
    let mut c = control();
    if let Some(e) = c.by_name.get(&(group.to_string(), name.to_string())) {
        if e.kind != kind {
            return Err(Error::input(format!("{group}/{name} is registered as {}, not {}; use another name or the same kind", e.kind.as_str(), kind.as_str())));
        }
        if e.hist.as_ref().map(|h| h.scale) != scale {
            return Err(Error::input(format!("{group}/{name} is registered with another bucket layout")));
        }
        return Ok(e);
    }
    let hist = match scale {
        Some(s) => Some(Histogram::new(s).map_err(|m| Error::input(format!("{group}/{name}: {m}")))?),
        None => None,
    };
    let id = c.entities.len() as u32 + 1;
    if id > crate::format::rec::ID_MASK {
        return Err(Error::input("too many entities (16777215 at most)".to_string()));
    }
    let e: &'static Entity = Box::leak(Box::new(Entity {
        mask: AtomicU32::new(c.mask_for(group)),
        id,
        kind,
        counter: AtomicI64::new(0),
        hist,
        group: group.to_string(),
        name: name.to_string(),
        desc: desc.to_string(),
    }));
    c.entities.push(e);
    c.by_name.insert((group.to_string(), name.to_string()), e);
    Ok(e)
}

/// Look an entity up by name without registering it.
pub fn lookup(group: &str, name: &str) -> Option<&'static Entity> {
    control().by_name.get(&(group.to_string(), name.to_string())).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_matches_prefixes_suffixes_and_everything() {
        assert!(glob("*", "anything"));
        assert!(glob("net*", "net.rx"));
        assert!(glob("*rx", "net.rx"));
        assert!(glob("n*t.*x", "net.rx"));
        assert!(!glob("net", "network"));
        assert!(!glob("net*", "ne"));
    }

    #[test]
    fn later_negations_exclude_groups() {
        let f = StreamFilter { patterns: vec!["*".into(), "!noisy".into()], overrides: HashMap::new() };
        assert!(f.enables("timer"));
        assert!(!f.enables("noisy"));
    }

    #[test]
    fn registering_a_name_again_with_another_kind_is_an_error() {
        let a = register("test-entity", "twice", Kind::Event, "", None).unwrap();
        let b = register("test-entity", "twice", Kind::Event, "", None).unwrap();
        assert!(std::ptr::eq(a, b));
        let e = register("test-entity", "twice", Kind::Counter, "", None).err().unwrap();
        assert!(e.to_string().contains("registered as event"), "{e}");
    }

    #[test]
    fn names_with_slashes_are_refused() {
        assert!(register("a/b", "c", Kind::Event, "", None).is_err());
        assert!(register("a", "", Kind::Event, "", None).is_err());
    }
}
