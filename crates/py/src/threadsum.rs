//! A folded activations pass (`ktrace::activations::summary`) as Python
//! sees it: a column per figure, a row per thread, and the kept outliers as
//! columns of their own. Quantiles are HdrHistogram's at the summary's
//! stated precision (`sig_digits`); `NULL` (int64's minimum) where a thread
//! has no value of a figure.

use loopscope_ktrace::activations::summary::{Figure, Summary, ThreadSum, SIG_DIGITS};
use numpy::IntoPyArray;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// One figure of a thread's fold.
type Pick = fn(&ThreadSum) -> &Figure;

/// {tid, activations, complete, preemptions, migrations, outliers; per figure
/// `<name>_p50`, `_p99`, `_max`; `worst_tid`, `worst_late`, `worst_start`,
/// `worst_end`, latest first within a thread; `sig_digits`}.
pub fn to_dict<'py>(py: Python<'py>, s: &Summary) -> PyResult<Bound<'py, PyDict>> {
    let o = PyDict::new(py);
    let th = &s.threads;
    let col = |f: &dyn Fn(&ThreadSum) -> i64| th.iter().map(f).collect::<Vec<i64>>();
    o.set_item("tid", col(&|t| t.tid).into_pyarray(py))?;
    o.set_item("activations", col(&|t| t.activations as i64).into_pyarray(py))?;
    o.set_item("complete", col(&|t| t.complete as i64).into_pyarray(py))?;
    o.set_item("preemptions", col(&|t| t.preemptions).into_pyarray(py))?;
    o.set_item("migrations", col(&|t| t.migrations).into_pyarray(py))?;
    let figures: [(&str, Pick); 5] = [
        ("wakeup_latency_ns", |t| &t.wakeup_latency),
        ("timer_lateness_ns", |t| &t.timer_lateness),
        ("runtime_ns", |t| &t.runtime),
        ("period_ns", |t| &t.period),
        ("on_bound_ns", |t| &t.on_bound),
    ];
    for (name, fig) in figures {
        o.set_item(format!("{name}_p50"), col(&|t| fig(t).quantile(0.5)).into_pyarray(py))?;
        o.set_item(format!("{name}_p99"), col(&|t| fig(t).quantile(0.99)).into_pyarray(py))?;
        o.set_item(format!("{name}_max"), col(&|t| fig(t).max()).into_pyarray(py))?;
    }
    let (mut n_out, mut w_tid, mut w_late, mut w_start, mut w_end) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for t in th {
        let (n, kept) = t.outliers();
        n_out.push(n as i64);
        for (late, a, b) in kept {
            w_tid.push(t.tid);
            w_late.push(late);
            w_start.push(a);
            w_end.push(b);
        }
    }
    o.set_item("outliers", n_out.into_pyarray(py))?;
    o.set_item("worst_tid", w_tid.into_pyarray(py))?;
    o.set_item("worst_late", w_late.into_pyarray(py))?;
    o.set_item("worst_start", w_start.into_pyarray(py))?;
    o.set_item("worst_end", w_end.into_pyarray(py))?;
    o.set_item("sig_digits", SIG_DIGITS)?;
    Ok(o)
}
