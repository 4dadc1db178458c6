//! The kernel's own description of its binary trace records.
//!
//! Every tracepoint has a `format` file in tracefs: `name:`, `ID:`, one
//! `field:` line per field (`offset:`, `size:`, `signed:`) and a `print fmt:`
//! that, for flags and enums, carries the value → name tables
//! (`__print_flags(…, { 0x01, "S" }, …)`, `__print_symbolic(…)`). Strings of
//! variable length are `__data_loc` fields (a u32: length << 16 | offset
//! from the record's start) or `__rel_loc` (offset from the end of the field).
//! `events/header_page` gives the page header the same way. Reading these
//! instead of hard-coding offsets keeps the decoder right on kernels whose
//! layouts differ (sched_stat_runtime lost its vruntime field in 6.6, for one).

use std::collections::HashMap;

/// Where a field's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loc {
    /// Inline at `offset`, `size` bytes.
    Inline,
    /// A u32 at `offset`: high 16 bits the length, low 16 the offset from the record's start.
    Data,
    /// Like `Data`, with the offset counted from the end of the u32.
    Rel,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    pub offset: usize,
    pub size: usize,
    pub signed: bool,
    pub loc: Loc,
    /// `char name[16]` and the like: read as a NUL-terminated string.
    pub is_string: bool,
}

#[derive(Debug, Clone)]
pub struct Format {
    pub system: String,
    pub name: String,
    pub id: u16,
    pub fields: Vec<Field>,
    /// Every `{ value, "name" }` pair of the print format, in order.
    pub symbols: Vec<(u64, String)>,
}

impl Format {
    pub fn field(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|f| f.name == name)
    }
}

fn parse_num(s: &str) -> Option<u64> {
    let s = s.trim();
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u64::from_str_radix(h, 16).ok()
    } else {
        s.parse().ok()
    }
}

/// `field:unsigned int vec;\toffset:8;\tsize:4;\tsigned:0;` → a field.
fn parse_field(line: &str) -> Option<Field> {
    let body = line.trim().strip_prefix("field:")?;
    let mut decl = "";
    let mut kv: HashMap<&str, &str> = HashMap::new();
    for (i, part) in body.split(';').enumerate() {
        let part = part.trim();
        if i == 0 {
            decl = part;
        } else if let Some((k, v)) = part.split_once(':') {
            kv.insert(k.trim(), v.trim());
        }
    }
    let loc = if decl.starts_with("__data_loc") {
        Loc::Data
    } else if decl.starts_with("__rel_loc") {
        Loc::Rel
    } else {
        Loc::Inline
    };
    let last = decl.split_whitespace().last()?;
    let (name, array) = match last.find('[') {
        Some(i) => (&last[..i], true),
        None => (last, false),
    };
    let is_string = loc != Loc::Inline || (array && decl.contains("char"));
    Some(Field {
        name: name.trim_start_matches('*').to_string(),
        offset: parse_num(kv.get("offset")?)? as usize,
        size: parse_num(kv.get("size")?)? as usize,
        signed: kv.get("signed").map(|s| *s == "1").unwrap_or(false),
        loc,
        is_string,
    })
}

/// The `{ value, "name" }` pairs of a print format, in order.
fn symbols(fmt: &str) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    let mut rest = fmt;
    while let Some(i) = rest.find('{') {
        rest = &rest[i + 1..];
        let Some(j) = rest.find('}') else { break };
        let inner = &rest[..j];
        if let Some((v, n)) = inner.split_once(',') {
            let n = n.trim();
            if let (Some(v), true) = (parse_num(v), n.starts_with('"') && n.ends_with('"') && n.len() >= 2) {
                out.push((v, n[1..n.len() - 1].to_string()));
            }
        }
        rest = &rest[j + 1..];
    }
    out
}

/// Parse one event's `format` file (`system` is its folder under `events/`).
/// A kernel event description the decoder cannot use. Always the input's
/// fault (the capture's `formats/`, or a kernel newer than the decoder).
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("{system}: a field line the decoder cannot read: {line:?}")]
    Field { system: String, line: String },
    #[error("{event}: the format has no {what}: line")]
    Missing { event: String, what: &'static str },
    #[error("events/header_page: {0}")]
    HeaderPage(String),
}

pub fn parse(system: &str, text: &str) -> Result<Format, FormatError> {
    let mut name = None;
    let mut id = None;
    let mut fields = Vec::new();
    let mut syms = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if let Some(v) = t.strip_prefix("name:") {
            name = Some(v.trim().to_string());
        } else if let Some(v) = t.strip_prefix("ID:") {
            id = v.trim().parse::<u16>().ok();
        } else if t.starts_with("field:") {
            fields.push(parse_field(t).ok_or_else(|| FormatError::Field { system: system.into(), line: t.into() })?);
        } else if let Some(v) = t.strip_prefix("print fmt:") {
            syms = symbols(v);
        }
    }
    let name = name.ok_or_else(|| FormatError::Missing { event: system.into(), what: "name" })?;
    let id = id.ok_or_else(|| FormatError::Missing { event: format!("{system}/{name}"), what: "ID" })?;
    Ok(Format { system: system.to_string(), name, id, fields, symbols: syms })
}

/// Where a ring-buffer page keeps its parts (`events/header_page`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageLayout {
    pub ts_off: usize,
    pub commit_off: usize,
    pub commit_size: usize,
    pub data_off: usize,
}

impl Default for PageLayout {
    /// The layout of every 64-bit kernel since 2.6.31.
    fn default() -> Self {
        PageLayout { ts_off: 0, commit_off: 8, commit_size: 8, data_off: 16 }
    }
}

pub fn parse_header_page(text: &str) -> Result<PageLayout, FormatError> {
    let mut l = PageLayout::default();
    let mut seen = 0;
    for line in text.lines() {
        let Some(f) = parse_field(line) else { continue };
        match f.name.as_str() {
            "timestamp" => {
                l.ts_off = f.offset;
                seen |= 1;
            }
            "commit" => {
                l.commit_off = f.offset;
                l.commit_size = f.size;
                seen |= 2;
            }
            "data" => {
                l.data_off = f.offset;
                seen |= 4;
            }
            _ => {}
        }
    }
    if seen != 7 {
        return Err(FormatError::HeaderPage("it lacks timestamp, commit or data".into()));
    }
    if l.commit_size != 4 && l.commit_size != 8 {
        return Err(FormatError::HeaderPage(format!("a commit word of {} bytes", l.commit_size)));
    }
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SWITCH: &str = "name: sched_switch\nID: 372\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;\n\tfield:pid_t prev_pid;\toffset:24;\tsize:4;\tsigned:1;\n\tfield:long prev_state;\toffset:32;\tsize:8;\tsigned:1;\n\nprint fmt: \"prev_state=%s\", (REC->prev_state & 255) ? __print_flags(REC->prev_state & 255, \"|\", { 0x00000001, \"S\" }, { 0x00000002, \"D\" }) : \"R\"\n";

    #[test]
    fn a_format_file_gives_id_fields_and_symbols() {
        let f = parse("sched", SWITCH).unwrap();
        assert_eq!((f.name.as_str(), f.id), ("sched_switch", 372));
        let c = f.field("prev_comm").unwrap();
        assert!(c.is_string && c.offset == 8 && c.size == 16);
        assert!(f.field("prev_pid").unwrap().signed);
        assert_eq!(f.symbols, vec![(1, "S".to_string()), (2, "D".to_string())]);
    }

    #[test]
    fn data_loc_fields_are_strings_of_their_own_kind() {
        let f = parse_field("field:__data_loc char[] comm;\toffset:8;\tsize:4;\tsigned:0;").unwrap();
        assert_eq!((f.name.as_str(), f.loc, f.is_string), ("comm", Loc::Data, true));
    }

    #[test]
    fn the_header_page_gives_the_page_layout() {
        let t = "\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;\n\tfield: local_t commit;\toffset:8;\tsize:8;\tsigned:1;\n\tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;\n\tfield: char data;\toffset:16;\tsize:4080;\tsigned:0;\n";
        assert_eq!(parse_header_page(t).unwrap(), PageLayout::default());
    }

    #[test]
    fn a_format_without_an_id_is_an_error_naming_it() {
        assert!(parse("irq", "name: x\n").unwrap_err().to_string().contains("irq/x"));
    }
}
