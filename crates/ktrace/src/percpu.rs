//! Values kept per CPU by the attribution pass, looked up for nearly every
//! event (whose task runs there, its open interrupt handlers, its runs).
//!
//! A hash map by CPU number cost a hash and a probe per lookup, several per
//! event; CPU numbers are small and dense, so they index a vector. A number
//! no machine has (a damaged recording's, or a negative "none") goes to a
//! map beside it, so nothing read is ever refused or sized by it.
//! Iteration is in CPU order (the vector's, then the map's, sorted), the
//! same every run.

use rustc_hash::FxHashMap;

/// CPU numbers kept in the vector: the kernel's largest `NR_CPUS`.
const DENSE: i64 = 8192;

pub struct PerCpu<T> {
    dense: Vec<Option<T>>,
    other: FxHashMap<i64, T>,
    len: usize,
}

impl<T> Default for PerCpu<T> {
    fn default() -> Self {
        PerCpu { dense: Vec::new(), other: FxHashMap::default(), len: 0 }
    }
}

/// Slot `i` of `dense`, the vector grown to hold it.
fn slot<T>(dense: &mut Vec<Option<T>>, i: usize) -> &mut Option<T> {
    if i >= dense.len() {
        dense.resize_with(i + 1, || None);
    }
    &mut dense[i]
}

impl<T> PerCpu<T> {
    pub fn get(&self, c: i64) -> Option<&T> {
        if (0..DENSE).contains(&c) {
            self.dense.get(c as usize).and_then(Option::as_ref)
        } else {
            self.other.get(&c)
        }
    }

    pub fn contains(&self, c: i64) -> bool {
        self.get(c).is_some()
    }

    /// The value for `c`, made by `f` when there is none.
    pub fn get_or_insert_with(&mut self, c: i64, f: impl FnOnce() -> T) -> &mut T {
        if (0..DENSE).contains(&c) {
            let slot = slot(&mut self.dense, c as usize);
            if slot.is_none() {
                self.len += 1;
            }
            slot.get_or_insert_with(f)
        } else {
            let len = &mut self.len;
            self.other.entry(c).or_insert_with(|| {
                *len += 1;
                f()
            })
        }
    }

    /// Set `c`'s value, giving back the one it replaces.
    pub fn insert(&mut self, c: i64, v: T) -> Option<T> {
        let old = if (0..DENSE).contains(&c) { slot(&mut self.dense, c as usize).replace(v) } else { self.other.insert(c, v) };
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    pub fn remove(&mut self, c: i64) -> Option<T> {
        let old = if (0..DENSE).contains(&c) { self.dense.get_mut(c as usize).and_then(Option::take) } else { self.other.remove(&c) };
        if old.is_some() {
            self.len -= 1;
        }
        old
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every (CPU, value), in CPU order.
    pub fn into_sorted(self) -> Vec<(i64, T)> {
        let mut out: Vec<(i64, T)> = self.dense.into_iter().enumerate().filter_map(|(i, v)| v.map(|v| (i as i64, v))).collect();
        let mut other: Vec<(i64, T)> = self.other.into_iter().collect();
        other.sort_by_key(|x| x.0);
        out.extend(other);
        out
    }

    /// The values, in CPU order.
    pub fn values(&self) -> impl Iterator<Item = &T> {
        let mut other: Vec<(&i64, &T)> = self.other.iter().collect();
        other.sort_by_key(|x| *x.0);
        self.dense.iter().flatten().chain(other.into_iter().map(|x| x.1))
    }
}

impl<T: Default> PerCpu<T> {
    /// The value for `c`, a default one made when there is none.
    pub fn entry(&mut self, c: i64) -> &mut T {
        self.get_or_insert_with(c, T::default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpus_in_and_out_of_the_vector_are_kept_counted_and_listed_in_order() {
        let mut m: PerCpu<i64> = PerCpu::default();
        assert!(m.is_empty() && m.get(3).is_none());
        *m.entry(3) += 1;
        *m.entry(3) += 1;
        assert_eq!(m.insert(-1, 7), None);
        assert_eq!(m.insert(1 << 40, 9), None);
        assert_eq!(m.insert(0, 5), None);
        assert_eq!(m.insert(0, 6), Some(5));
        assert_eq!((m.get(3), m.get(-1), m.get(1 << 40), m.get(2)), (Some(&2), Some(&7), Some(&9), None));
        assert_eq!(m.values().copied().collect::<Vec<_>>(), vec![6, 2, 7, 9]);
        assert_eq!(m.remove(3), Some(2));
        assert_eq!(m.remove(3), None);
        assert!(m.contains(-1) && !m.contains(3));
        assert_eq!(m.into_sorted(), vec![(0, 6), (-1, 7), (1 << 40, 9)]);
    }
}
