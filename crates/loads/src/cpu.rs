//! The computation load: Huffman-code a 5000-byte buffer, again and again.
//!
//! Each unit counts symbol frequencies, builds the code tree with a binary
//! heap, derives code lengths and codes, and packs the buffer into a bit
//! stream: table-driven, branchy, cache-touching work like the compression
//! load of Carlinet et al. 2000, rather than a spin loop that only heats one ALU.

use crate::{Rng, Work};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

pub const BUFFER: usize = 5000;

/// A reusable Huffman coder.
pub struct Huffman {
    parent: Vec<usize>,
    len: [u8; 256],
    code: [u32; 256],
    out: Vec<u64>,
}

impl Default for Huffman {
    fn default() -> Self {
        Self::new()
    }
}

impl Huffman {
    pub fn new() -> Huffman {
        Huffman { parent: vec![0; 512], len: [0; 256], code: [0; 256], out: Vec::with_capacity(BUFFER / 4) }
    }

    /// Encode `data`; returns the number of bits produced.
    pub fn encode(&mut self, data: &[u8]) -> u64 {
        let mut freq = [0u64; 256];
        for &b in data {
            freq[b as usize] += 1;
        }
        let mut heap: BinaryHeap<Reverse<(u64, usize)>> = freq.iter().enumerate().filter(|(_, &f)| f > 0).map(|(s, &f)| Reverse((f, s))).collect();
        if heap.len() == 1 {
            let Reverse((_, s)) = *heap.peek().unwrap();
            self.len = [0; 256];
            self.len[s] = 1;
        } else {
            let mut next = 256;
            while heap.len() > 1 {
                let Reverse((fa, a)) = heap.pop().unwrap();
                let Reverse((fb, b)) = heap.pop().unwrap();
                self.parent[a] = next;
                self.parent[b] = next;
                heap.push(Reverse((fa + fb, next)));
                next += 1;
            }
            let root = next - 1;
            for s in 0..256 {
                self.len[s] = 0;
                if freq[s] > 0 {
                    let (mut n, mut d) = (s, 0u8);
                    while n != root {
                        n = self.parent[n];
                        d += 1;
                    }
                    self.len[s] = d.min(31);
                }
            }
        }
        // Canonical codes from the lengths.
        let mut code = 0u32;
        for l in 1..=31u8 {
            for s in 0..256 {
                if self.len[s] == l {
                    self.code[s] = code;
                    code += 1;
                }
            }
            code <<= 1;
        }
        self.out.clear();
        let (mut acc, mut bits, mut total) = (0u64, 0u32, 0u64);
        for &b in data {
            let (c, l) = (self.code[b as usize] as u64, self.len[b as usize] as u32);
            if bits + l > 64 {
                self.out.push(acc);
                acc = 0;
                bits = 0;
            }
            acc |= c << bits;
            bits += l;
            total += l as u64;
        }
        self.out.push(acc);
        total
    }
}

pub(crate) struct CpuWork {
    data: Vec<u8>,
    h: Huffman,
    sink: u64,
}

impl CpuWork {
    pub fn new() -> CpuWork {
        // Text-like skewed symbols, so the code has many lengths.
        let mut r = Rng::new(0x5eed);
        let data = (0..BUFFER)
            .map(|_| {
                let x = r.next();
                let k = (x % 100) as u8;
                if k < 60 {
                    b'a' + (x >> 8) as u8 % 8
                } else if k < 90 {
                    b'a' + (x >> 8) as u8 % 26
                } else {
                    (x >> 16) as u8
                }
            })
            .collect();
        CpuWork { data, h: Huffman::new(), sink: 0 }
    }
}

impl Work for CpuWork {
    fn step(&mut self) -> crate::error::Result<u64> {
        self.sink = self.sink.wrapping_add(self.h.encode(&self.data));
        // Perturb one byte so no unit is exactly the previous one.
        let i = (self.sink as usize) % BUFFER;
        self.data[i] = self.data[i].wrapping_add(1);
        std::hint::black_box(self.sink);
        Ok(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huffman_codes_are_shorter_than_the_input_for_skewed_text() {
        let mut h = Huffman::new();
        let data: Vec<u8> = b"aaaaaaaabbbbccd".iter().cycle().take(5000).copied().collect();
        let bits = h.encode(&data);
        assert!(bits < 5000 * 8 / 3, "{bits}");
        // A single symbol still gets a 1-bit code.
        assert_eq!(h.encode(&[7u8; 100]), 100);
    }
}
