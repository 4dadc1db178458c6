//! A capture's string table made native once, for the attribution of its
//! clusters of windows (`ktrace::ktrace_attribute`).

use pyo3::prelude::*;
use std::sync::Arc;

/// A capture's string table (its task names, states and handler names: 121,512
/// of them on a busy capture), made native once. Attribution borrows it for
/// every cluster of windows; a Python list is copied into new strings at
/// every call (three tables a cluster), under the interpreter lock.
#[pyclass(frozen, module = "loopscope._native", name = "StringTable")]
pub struct StringTable(Arc<Vec<String>>);

#[pymethods]
impl StringTable {
    #[new]
    fn new(strings: Vec<String>) -> Self {
        StringTable(Arc::new(strings))
    }

    fn __len__(&self) -> usize {
        self.0.len()
    }
}

/// A table given as a `StringTable` (shared) or a list of strings (copied).
pub fn table(obj: &Bound<'_, PyAny>) -> PyResult<Arc<Vec<String>>> {
    match obj.cast::<StringTable>() {
        Ok(t) => Ok(t.get().0.clone()),
        Err(_) => Ok(Arc::new(obj.extract::<Vec<String>>()?)),
    }
}
