//! The memory load: fill an array of random integers and sort it.
//!
//! 10 M 32-bit integers (40 MB) per worker by default, as in Carlinet et al. 2000:
//! the array is allocated once and refilled each unit, so the load is memory
//! bandwidth and cache pressure rather than page-fault churn.

use crate::{Rng, Work};

pub(crate) struct MemoryWork {
    v: Vec<u32>,
    rng: Rng,
}

impl MemoryWork {
    pub fn new(count: usize) -> MemoryWork {
        MemoryWork { v: vec![0; count.max(1)], rng: Rng::new(std::process::id() as u64 * 7919) }
    }
}

impl Work for MemoryWork {
    fn step(&mut self) -> crate::error::Result<u64> {
        for x in self.v.iter_mut() {
            *x = self.rng.next() as u32;
        }
        self.v.sort_unstable();
        std::hint::black_box(&self.v);
        Ok(1)
    }
}
