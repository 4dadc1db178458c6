//! Task names and labels, each stored once: the decoder's text columns
//! hold indices into this table.
//!
//! Every string field of every event is looked up (a busy machine's
//! switches carry two task names each), so the lookup is the decoder's
//! hottest path: a name of at most 16 bytes (the kernel's task names) is
//! one 128-bit key read straight from the field, found first among the
//! names looked up last (one compare), then in a fast hash map.

/// Strings seen so far, each once; columns hold their indices.
pub(crate) struct Interner {
    pub(crate) list: Vec<String>,
    // a fast hash: task names are interned once per string field of every event (a third of decoding with SipHash)
    map: rustc_hash::FxHashMap<Vec<u8>, i64>,
    short: rustc_hash::FxHashMap<u128, i64>,
    /// the last names looked up, by a few bits of their key: a busy
    /// machine's events name the same few tasks, and a hit costs one compare
    recent: Box<[(u128, i64); RECENT]>,
}

/// Slots of `Interner::recent` (a power of two).
const RECENT: usize = 256;

impl Default for Interner {
    fn default() -> Self {
        Interner { list: Vec::new(), map: Default::default(), short: Default::default(), recent: Box::new([(0, -1); RECENT]) }
    }
}

impl Interner {
    pub(crate) fn get(&mut self, b: &[u8]) -> i64 {
        // task names (at most 16 bytes, NUL-padded) are looked up as one 128-bit key: no hashing of bytes, no compare of slices
        if let Some(key) = short_key(b) {
            let slot = ((key as u64 ^ (key >> 64) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - RECENT.trailing_zeros())) as usize;
            let r = self.recent[slot];
            if r.0 == key && r.1 >= 0 {
                return r.1;
            }
            let i = match self.short.get(&key) {
                Some(&i) => i,
                None => {
                    let len = 16 - (key.leading_zeros() / 8) as usize;
                    let i = self.push(&key.to_le_bytes()[..len]);
                    self.short.insert(key, i);
                    i
                }
            };
            self.recent[slot] = (key, i);
            return i;
        }
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        let s = &b[..end];
        if let Some(&i) = self.map.get(s) {
            return i;
        }
        let i = self.push(s);
        self.map.insert(s.to_vec(), i);
        i
    }

    fn push(&mut self, s: &[u8]) -> i64 {
        self.list.push(String::from_utf8_lossy(s).into_owned());
        self.list.len() as i64 - 1
    }
}

/// The string `b` holds (up to its first NUL) as a little-endian 128-bit
/// key, when it is at most 16 bytes long; None for longer strings.
fn short_key(b: &[u8]) -> Option<u128> {
    const ONES: u128 = u128::from_le_bytes([0x01; 16]);
    const HIGHS: u128 = u128::from_le_bytes([0x80; 16]);
    let v = if b.len() >= 16 {
        u128::from_le_bytes(b[..16].try_into().expect("16 bytes"))
    } else {
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        let mut k = [0u8; 16];
        k[..end].copy_from_slice(&b[..end]);
        return Some(u128::from_le_bytes(k));
    };
    // the lowest byte that is zero (bytes above a zero one can read as zero too: only the first counts)
    let zeros = v.wrapping_sub(ONES) & !v & HIGHS;
    if zeros == 0 {
        // 16 bytes without a NUL: the whole string when nothing follows or a NUL does
        return (b.len() == 16 || b[16] == 0).then_some(v);
    }
    let len = (zeros.trailing_zeros() / 8) as usize;
    Some(if len == 0 { 0 } else { v & (u128::MAX >> (128 - 8 * len)) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_name_is_keyed_by_its_bytes_up_to_the_first_nul_whatever_follows() {
        let mut field = *b"kworker/0:1\0\0\0\0\0";
        let a = short_key(&field).unwrap();
        field[13] = b'x'; // left over from a longer name, past the NUL
        assert_eq!(short_key(&field), Some(a));
        assert_eq!(short_key(b"kworker/0:1"), Some(a));
        assert_eq!(a.to_le_bytes()[..11], *b"kworker/0:1");
        assert_eq!(short_key(b"sixteen-letters!"), Some(u128::from_le_bytes(*b"sixteen-letters!")));
        assert_eq!(short_key(b"\0abc"), Some(0));
        assert_eq!(short_key(b"a label longer than sixteen bytes"), None);
        assert_eq!(short_key(b"sixteen-letters!\0and more"), Some(u128::from_le_bytes(*b"sixteen-letters!")));
    }

    #[test]
    fn names_that_share_a_recent_slot_keep_their_own_indices() {
        let mut s = Interner::default();
        let names: Vec<String> = (0..3 * RECENT).map(|i| format!("task-{i}")).collect();
        let first: Vec<i64> = names.iter().map(|n| s.get(n.as_bytes())).collect();
        let again: Vec<i64> = names.iter().rev().map(|n| s.get(n.as_bytes())).collect();
        assert_eq!(first, again.into_iter().rev().collect::<Vec<_>>());
        assert_eq!(s.list.len(), 3 * RECENT);
        assert_eq!(s.get(b""), s.get(b"\0\0\0"));
        assert_eq!(s.list[first[7] as usize], "task-7");
    }
}
