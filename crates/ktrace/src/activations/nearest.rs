//! Carrying a timer's expiry from CLOCK_MONOTONIC onto a capture's clock.

/// The offset nearest a time (a capture's clock minus CLOCK_MONOTONIC, by
/// the time it was seen), times asked in increasing order: a tie goes to the
/// later offset, and of offsets at one time the last counts (as polars'
/// `join_asof(strategy="nearest")` takes them); none: 0.
pub struct Nearest {
    t: Vec<i64>,
    off: Vec<i64>,
    j: usize,
}

impl Nearest {
    pub fn new(t: Vec<i64>, off: Vec<i64>) -> Self {
        let (mut tt, mut oo): (Vec<i64>, Vec<i64>) = (Vec::with_capacity(t.len()), Vec::with_capacity(t.len()));
        for (a, o) in t.into_iter().zip(off) {
            if tt.last() == Some(&a) {
                *oo.last_mut().unwrap_or(&mut 0) = o;
            } else {
                tt.push(a);
                oo.push(o);
            }
        }
        Nearest { t: tt, off: oo, j: 0 }
    }

    pub fn at(&mut self, t: i64) -> i64 {
        while self.j < self.t.len() && self.t[self.j] <= t {
            self.j += 1;
        }
        match (self.j.checked_sub(1), self.t.get(self.j)) {
            (Some(b), Some(&up)) if up - t <= t - self.t[b] => self.off[self.j],
            (Some(b), _) => self.off[b],
            (None, Some(_)) => self.off[self.j],
            (None, None) => 0,
        }
    }
}
