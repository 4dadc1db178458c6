//! `netem_run`: the link emulator (crates/netem) from Python.
//!
//! The configuration arrives as JSON (the lab builds it from the experiment
//! file); the interfaces are opened before anything else so a bad name fails
//! at once, then `ready` is written to `ready_fd` (the lab waits for it) and
//! the loop runs with the interpreter lock released until Ctrl-C/SIGTERM or
//! the duration.

use super::{hist_dict, py_err, run_interruptible, InputError};
use loopscope_netem::{self as netem, Dist, LinkSpec, PortSpec};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use serde_json::Value;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

fn field<'a>(v: &'a Value, k: &str, what: &str) -> PyResult<&'a Value> {
    v.get(k).ok_or_else(|| InputError::new_err(format!("netem config: {what} has no {k:?}")))
}

fn num(v: &Value, k: &str, what: &str) -> PyResult<f64> {
    field(v, k, what)?.as_f64().ok_or_else(|| InputError::new_err(format!("netem config: {what}.{k} is not a number")))
}

fn text<'a>(v: &'a Value, k: &str, what: &str) -> PyResult<&'a str> {
    field(v, k, what)?.as_str().ok_or_else(|| InputError::new_err(format!("netem config: {what}.{k} is not a string")))
}

fn mac(s: &str) -> PyResult<[u8; 6]> {
    let parts: Vec<u8> = s.split(':').filter_map(|p| u8::from_str_radix(p, 16).ok()).collect();
    parts.try_into().map_err(|_| InputError::new_err(format!("netem config: bad MAC address {s:?}")))
}

fn ipv4(s: &str) -> PyResult<u32> {
    s.parse::<std::net::Ipv4Addr>().map(u32::from).map_err(|_| InputError::new_err(format!("netem config: bad IPv4 address {s:?}")))
}

fn parse(config: &str) -> PyResult<netem::Config> {
    let v: Value = serde_json::from_str(config).map_err(|e| InputError::new_err(format!("netem config: {e}")))?;
    let mut ports = Vec::new();
    for (i, p) in field(&v, "ports", "config")?.as_array().into_iter().flatten().enumerate() {
        let w = format!("ports[{i}]");
        ports.push(PortSpec {
            host: text(p, "host", &w)?.to_string(),
            ifname: text(p, "ifname", &w)?.to_string(),
            host_mac: mac(text(p, "host_mac", &w)?)?,
            router_ip: ipv4(text(p, "router_ip", &w)?)?,
            net: ipv4(text(p, "net", &w)?)?,
            prefix: num(p, "prefix", &w)? as u8,
        });
    }
    let mut links = Vec::new();
    for (i, l) in field(&v, "links", "config")?.as_array().into_iter().flatten().enumerate() {
        let w = format!("links[{i}]");
        let rate = l.get("rate_bps").and_then(Value::as_f64);
        links.push(LinkSpec {
            name: text(l, "name", &w)?.to_string(),
            from: num(l, "from", &w)? as usize,
            to: num(l, "to", &w)? as usize,
            delay_ns: num(l, "delay_ns", &w)? as i64,
            jitter_ns: num(l, "jitter_ns", &w)? as i64,
            dist: Dist::parse(text(l, "distribution", &w)?).map_err(py_err)?,
            loss: num(l, "loss", &w)?,
            duplicate: num(l, "duplicate", &w)?,
            reorder: num(l, "reorder", &w)?,
            rate_bps: rate,
            limit: num(l, "limit", &w)? as usize,
        });
    }
    Ok(netem::Config {
        ports,
        links,
        seed: v.get("seed").and_then(Value::as_u64).unwrap_or(1),
        records: v.get("records").and_then(Value::as_bool).unwrap_or(true),
        duration_ns: v.get("duration_ns").and_then(Value::as_u64),
        sockbuf: v.get("sockbuf").and_then(Value::as_u64).unwrap_or(8 << 20) as usize,
        priority: v.get("priority").and_then(Value::as_i64).unwrap_or(0) as i32,
        kernel_paths: v
            .get("kernel_paths")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|p| Some((p.get(0)?.as_u64()? as usize, p.get(1)?.as_u64()? as usize)))
            .collect(),
        rings: v.get("rings").and_then(Value::as_bool).unwrap_or(true),
        poll: v.get("poll").and_then(Value::as_bool).unwrap_or(false),
        cpu: v.get("cpu").and_then(Value::as_u64).map(|c| c as usize),
        spin_max_ns: v.get("spin_max_ns").and_then(Value::as_i64).unwrap_or(150_000),
        spin_permille: (v.get("spin_quantile").and_then(Value::as_f64).unwrap_or(0.5) * 1000.0).round() as usize,
    })
}

extern "C" fn on_usr1(_: libc::c_int) {
    netem::RELOAD.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Run the emulator; returns per-link and per-port counts and histograms.
#[pyfunction]
#[pyo3(signature = (config, ready_fd=None, reload_path=None))]
pub fn netem_run<'py>(py: Python<'py>, config: &str, ready_fd: Option<i32>, reload_path: Option<String>) -> PyResult<Bound<'py, PyDict>> {
    let cfg = parse(config)?;
    let (ports, unfiltered) = netem::open_ports(&cfg).map_err(py_err)?;
    if let Some(fd) = ready_fd {
        let msg = b"ready\n";
        unsafe { libc::write(fd, msg.as_ptr() as *const libc::c_void, msg.len()) };
    }
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let c2 = cfg.clone();
    // SIGUSR1: take new link settings from `reload_path` (the same JSON), then
    // say `reloaded` on `ready_fd`.
    let reload: Option<netem::Reload> = reload_path.map(|path| {
        unsafe { libc::signal(libc::SIGUSR1, on_usr1 as *const () as libc::sighandler_t) };
        Box::new(move || {
            let text = std::fs::read_to_string(&path).map_err(|e| netem::NetemError::Config(format!("{path}: {e}")))?;
            let links = Python::attach(|_| parse(&text).map(|c| c.links).map_err(|e| netem::NetemError::Config(e.to_string())))?;
            if let Some(fd) = ready_fd {
                let msg = format!("reloaded {}\n", links.len());
                unsafe { libc::write(fd, msg.as_ptr() as *const libc::c_void, msg.len()) };
            }
            Ok(links)
        }) as netem::Reload
    });
    let (r, interrupted) = run_interruptible(py, "ls-netem", stop, move || netem::run_with(&c2, ports, s2, reload))?;
    let r = r.map_err(py_err)?;
    let d = PyDict::new(py);
    let links = PyList::empty(py);
    for l in &r.links {
        let ld = PyDict::new(py);
        ld.set_item("name", &l.name)?;
        ld.set_item("from", &l.from)?;
        ld.set_item("to", &l.to)?;
        ld.set_item("configured", l.configured)?;
        ld.set_item("packets_in", l.packets_in)?;
        ld.set_item("bytes_in", l.bytes_in)?;
        ld.set_item("forwarded", l.forwarded)?;
        ld.set_item("lost", l.lost)?;
        ld.set_item("duplicated", l.duplicated)?;
        ld.set_item("reordered", l.reordered)?;
        ld.set_item("queue_drops", l.queue_drops)?;
        ld.set_item("send_errors", l.send_errors)?;
        ld.set_item("pending_at_stop", l.pending_at_stop)?;
        ld.set_item("kernel", l.kernel)?;
        ld.set_item("applied", hist_dict(py, &l.applied)?)?;
        ld.set_item("late", hist_dict(py, &l.late)?)?;
        ld.set_item("queued", hist_dict(py, &l.queued)?)?;
        links.append(ld)?;
    }
    d.set_item("links", links)?;
    let ports = PyList::empty(py);
    for p in &r.ports {
        let pd = PyDict::new(py);
        pd.set_item("host", &p.host)?;
        pd.set_item("ifname", &p.ifname)?;
        pd.set_item("frames", p.frames)?;
        pd.set_item("not_for_router", p.not_for_router)?;
        pd.set_item("not_ipv4", p.not_ipv4)?;
        pd.set_item("to_router", p.to_router)?;
        pd.set_item("unrouted", p.unrouted)?;
        pd.set_item("ttl_expired", p.ttl_expired)?;
        pd.set_item("no_kernel_ts", p.no_kernel_ts)?;
        pd.set_item("kernel_path", p.kernel_path)?;
        pd.set_item("socket_drops", p.socket_drops)?;
        pd.set_item("truncated", p.truncated)?;
        pd.set_item("tx_refused", p.tx_refused)?;
        pd.set_item("io", &p.io)?;
        ports.append(pd)?;
    }
    d.set_item("ports", ports)?;
    d.set_item("hist_scale", serde_json::to_string(&r.hist_scale).unwrap_or_default())?;
    d.set_item("elapsed_ns", r.elapsed_ns)?;
    d.set_item("interrupted", interrupted || r.interrupted)?;
    d.set_item("final_margin_ns", r.final_margin_ns)?;
    d.set_item("sleeps", r.sleeps)?;
    d.set_item("priority", r.priority)?;
    d.set_item("policy", &r.policy_note)?;
    d.set_item("reload_errors", r.reload_errors.clone())?;
    d.set_item("unfiltered", unfiltered)?;
    d.set_item("wait", &r.wait)?;
    d.set_item("cpu_note", &r.cpu_note)?;
    d.set_item("cpu_ns", r.cpu_ns)?;
    Ok(d)
}
