//! Order statistics of block-bootstrap replicates: each replicate is made
//! of circular blocks of each repetition's samples, whose starts numpy
//! draws (so the seeds give the figures they always gave); the k-th
//! smallest of each replicate for every ``k`` asked, and its mean, with the
//! interpreter lock released.
//!
//! Why not numpy: it builds the (replicates × samples) index and value
//! matrices (96 MB each for 40,000 samples), then ``np.partition`` copies
//! one again and selects row by row; on this machine the fresh pages alone
//! cost more than the selection. Here the samples are ranked once, and a
//! replicate is only how many times it holds each sample: +1 where a block
//! starts and -1 past its end, summed in order. Its k-th smallest is the
//! sample, in rank order, at which those counts first add up past k, and
//! its mean the counts times the samples. Three passes a replicate over a
//! small array, where copying each replicate's samples and selecting in
//! them (pdqselect, as before) spent a fifth of a fresh report's CPU. The
//! k-th smallest is exact, so the quantiles equal numpy's; a mean is summed
//! in sample order, where numpy sums pairwise (they differ in the last bits).

use numpy::{IntoPyArray, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// One repetition's samples (``values[off..off + n]``) and the starts of
/// its circular blocks of ``block`` samples, a row of ``k`` per replicate.
struct Series<'a> {
    off: usize,
    n: usize,
    block: usize,
    starts: numpy::ndarray::ArrayView2<'a, i64>,
}

/// Per replicate (row of every series' ``starts``): its samples, each
/// series' circular blocks laid end to end and cut at the series' length,
/// as numpy's ``block_indices`` lays them; the ``ks``-th smallest (a row of
/// ``len(ks)``) and, when ``mean``, the mean.
#[pyfunction]
#[pyo3(signature = (values, lengths, starts, block, ks, mean))]
pub fn boot_select<'py>(
    py: Python<'py>,
    values: PyReadonlyArray1<'py, f64>,
    lengths: Vec<usize>,
    starts: Vec<PyReadonlyArray2<'py, i64>>,
    block: usize,
    ks: Vec<usize>,
    mean: bool,
) -> PyResult<(Bound<'py, numpy::PyArray1<f64>>, Bound<'py, numpy::PyArray1<f64>>)> {
    let v = values.as_slice()?;
    let n: usize = lengths.iter().sum();
    let bad = |why: String| Err(PyValueError::new_err(format!("boot_select: {why}")));
    if n != v.len() || lengths.len() != starts.len() {
        return bad(format!("{} lengths adding to {n} for {} values and {} starts", lengths.len(), v.len(), starts.len()));
    }
    if ks.windows(2).any(|w| w[0] > w[1]) || ks.last().is_some_and(|&k| k >= n) {
        return bad(format!("ks must be ascending and under {n}"));
    }
    let mut series = Vec::new();
    let mut off = 0;
    let mut rows = None;
    for (len, st) in lengths.iter().zip(&starts) {
        let a = st.as_array();
        let l = block.clamp(1, (*len).max(1));
        if *len > 0 && (a.ncols() * l < *len || a.iter().any(|&s| s < 0 || s as usize >= *len) || rows.is_some_and(|r| r != a.nrows())) {
            return bad(format!("the starts of a series of {len} samples do not fit it"));
        }
        if *len > 0 {
            rows = Some(a.nrows());
            series.push(Series { off, n: *len, block: l, starts: a });
        }
        off += len;
    }
    let rows = rows.unwrap_or(0);
    let (picked, means) = crate::detached(py, move || {
        // every sample's rank among all of them, once: a replicate is then a count per sample
        let mut perm: Vec<u32> = (0..n as u32).collect();
        perm.sort_unstable_by(|&a, &b| v[a as usize].total_cmp(&v[b as usize]));
        let mut picked = vec![0.0f64; rows * ks.len()];
        let mut means = vec![0.0f64; if mean { rows } else { 0 }];
        // how often each sample is in the replicate: +1 where a block starts, -1 past its end, summed in order
        let mut times = vec![0i32; n + 1];
        for r in 0..rows {
            times.fill(0);
            for s in &series {
                let mut left = s.n;
                for &st in s.starts.row(r) {
                    let (st, take) = (st as usize, s.block.min(left));
                    let head = take.min(s.n - st);
                    times[s.off + st] += 1;
                    times[s.off + st + head] -= 1;
                    if take > head {
                        // a block wrapping past the end
                        times[s.off] += 1;
                        times[s.off + take - head] -= 1;
                    }
                    left -= take;
                    if left == 0 {
                        break;
                    }
                }
            }
            let mut run = 0i32;
            let mut sum = 0.0f64;
            for (t, &x) in times[..n].iter_mut().zip(v) {
                run += *t;
                *t = run;
                sum += f64::from(run) * x;
            }
            if mean {
                means[r] = sum / n as f64;
            }
            // the k-th smallest: the sample, in rank order, at which the counts first pass k
            let (mut j, mut seen) = (0usize, 0usize);
            for (q, &k) in ks.iter().enumerate() {
                while seen <= k {
                    seen += times[perm[j] as usize] as usize;
                    j += 1;
                }
                picked[r * ks.len() + q] = v[perm[j - 1] as usize];
            }
        }
        (picked, means)
    })?;
    Ok((picked.into_pyarray(py), means.into_pyarray(py)))
}
