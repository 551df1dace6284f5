//! A strict reader over a parsed TOML document that collects every error with its path.
//!
//! serde's derive stops at the first unknown key or wrong type; an operator fixing a config
//! wants the whole list at once (linkerd2-proxy's rule: parse everything, then report).

use std::collections::BTreeSet;

use toml::{Table, Value};

use super::ConfigError;

/// One TOML table being read. Every key read is remembered; [`Obj::finish`] reports the
/// keys nobody asked for as unknown.
pub(crate) struct Obj<'a> {
    path: String,
    table: &'a Table,
    used: BTreeSet<&'a str>,
}

impl<'a> Obj<'a> {
    pub(crate) fn new(path: impl Into<String>, table: &'a Table) -> Self {
        Obj {
            path: path.into(),
            table,
            used: BTreeSet::new(),
        }
    }

    /// Whether the key is present at all (so "required" is not reported on top of a type
    /// error for the same key).
    pub(crate) fn has(&self, key: &str) -> bool {
        self.table.contains_key(key)
    }

    /// The path of a key inside this table, for error messages.
    pub(crate) fn key_path(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    fn get(&mut self, key: &str) -> Option<&'a Value> {
        let (k, v) = self.table.get_key_value(key)?;
        self.used.insert(k.as_str());
        Some(v)
    }

    pub(crate) fn string(&mut self, key: &str, errs: &mut Vec<ConfigError>) -> Option<&'a str> {
        match self.get(key)? {
            Value::String(s) => Some(s.as_str()),
            other => {
                errs.push(ConfigError::new(
                    self.key_path(key),
                    format!("expected a string, found {}", other.type_str()),
                ));
                None
            }
        }
    }

    /// A string, or an array of strings.
    pub(crate) fn strings(
        &mut self,
        key: &str,
        errs: &mut Vec<ConfigError>,
    ) -> Option<Vec<String>> {
        let path = self.key_path(key);
        match self.get(key)? {
            Value::String(s) => Some(vec![s.clone()]),
            Value::Array(items) => {
                let mut out = Vec::with_capacity(items.len());
                for (i, v) in items.iter().enumerate() {
                    match v {
                        Value::String(s) => out.push(s.clone()),
                        other => errs.push(ConfigError::new(
                            format!("{path}[{i}]"),
                            format!("expected a string, found {}", other.type_str()),
                        )),
                    }
                }
                Some(out)
            }
            other => {
                errs.push(ConfigError::new(
                    path,
                    format!(
                        "expected a string or an array of strings, found {}",
                        other.type_str()
                    ),
                ));
                None
            }
        }
    }

    pub(crate) fn integer(&mut self, key: &str, errs: &mut Vec<ConfigError>) -> Option<i64> {
        match self.get(key)? {
            Value::Integer(i) => Some(*i),
            other => {
                errs.push(ConfigError::new(
                    self.key_path(key),
                    format!("expected an integer, found {}", other.type_str()),
                ));
                None
            }
        }
    }

    /// `true` or `false`, TOML's booleans. A string is not read as one, even `"true"` or
    /// `"on"`: it is refused with its value, so the file shows what to unquote.
    pub(crate) fn boolean(&mut self, key: &str, errs: &mut Vec<ConfigError>) -> Option<bool> {
        let found = match self.get(key)? {
            Value::Boolean(b) => return Some(*b),
            Value::String(s) => format!("string {s:?}"),
            other => other.type_str().to_string(),
        };
        errs.push(ConfigError::new(
            self.key_path(key),
            format!("expected a boolean (true or false), found {found}"),
        ));
        None
    }

    /// An integer in `lo..=hi`.
    pub(crate) fn int_in(
        &mut self,
        key: &str,
        lo: i64,
        hi: i64,
        errs: &mut Vec<ConfigError>,
    ) -> Option<i64> {
        let v = self.integer(key, errs)?;
        if v < lo || v > hi {
            errs.push(ConfigError::new(
                self.key_path(key),
                format!("{v} is out of range {lo}..={hi}"),
            ));
            return None;
        }
        Some(v)
    }

    /// A count in `lo..=hi`, `default` when absent or invalid.
    pub(crate) fn count(
        &mut self,
        key: &str,
        default: u32,
        lo: u32,
        hi: u32,
        errs: &mut Vec<ConfigError>,
    ) -> u32 {
        self.int_in(key, i64::from(lo), i64::from(hi), errs)
            .map(|v| v as u32)
            .unwrap_or(default)
    }

    /// Milliseconds in `lo..=hi` as a duration, `default` when absent or invalid.
    pub(crate) fn millis(
        &mut self,
        key: &str,
        default: u64,
        lo: u64,
        hi: u64,
        errs: &mut Vec<ConfigError>,
    ) -> std::time::Duration {
        let v = self
            .int_in(key, lo as i64, hi as i64, errs)
            .map(|v| v as u64)
            .unwrap_or(default);
        std::time::Duration::from_millis(v)
    }

    /// [`Obj::millis`], but `None` when the key is there and invalid: a check against
    /// another key must not compare with the default standing in for it.
    pub(crate) fn millis_checked(
        &mut self,
        key: &str,
        default: u64,
        lo: u64,
        hi: u64,
        errs: &mut Vec<ConfigError>,
    ) -> Option<std::time::Duration> {
        let before = errs.len();
        let d = self.millis(key, default, lo, hi, errs);
        (errs.len() == before).then_some(d)
    }

    /// A number that must satisfy `ok`; otherwise `why` is reported against its path
    /// (the value is still returned, so later checks see what was written).
    pub(crate) fn float_where(
        &mut self,
        key: &str,
        ok: impl Fn(f64) -> bool,
        why: &str,
        errs: &mut Vec<ConfigError>,
    ) -> Option<f64> {
        let v = self.float(key, errs)?;
        if !ok(v) {
            errs.push(ConfigError::new(self.key_path(key), why.to_string()));
        }
        Some(v)
    }

    pub(crate) fn float(&mut self, key: &str, errs: &mut Vec<ConfigError>) -> Option<f64> {
        match self.get(key)? {
            Value::Float(f) if f.is_finite() => Some(*f),
            Value::Integer(i) => Some(*i as f64),
            Value::Float(f) => {
                errs.push(ConfigError::new(
                    self.key_path(key),
                    format!("{f} is not a finite number"),
                ));
                None
            }
            other => {
                errs.push(ConfigError::new(
                    self.key_path(key),
                    format!("expected a number, found {}", other.type_str()),
                ));
                None
            }
        }
    }

    pub(crate) fn table(&mut self, key: &str, errs: &mut Vec<ConfigError>) -> Option<Obj<'a>> {
        let path = self.key_path(key);
        match self.get(key)? {
            Value::Table(t) => Some(Obj::new(path, t)),
            other => {
                errs.push(ConfigError::new(
                    path,
                    format!("expected a table, found {}", other.type_str()),
                ));
                None
            }
        }
    }

    /// An array of tables (`[[key]]`), each with its index in the array and its indexed
    /// path (`service[1]`).
    pub(crate) fn tables(
        &mut self,
        key: &str,
        errs: &mut Vec<ConfigError>,
    ) -> Vec<(usize, Obj<'a>)> {
        let path = self.key_path(key);
        match self.get(key) {
            None => Vec::new(),
            Some(Value::Array(items)) => {
                let mut out = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    match item {
                        Value::Table(t) => out.push((i, Obj::new(format!("{path}[{i}]"), t))),
                        other => errs.push(ConfigError::new(
                            format!("{path}[{i}]"),
                            format!("expected a table, found {}", other.type_str()),
                        )),
                    }
                }
                out
            }
            Some(other) => {
                errs.push(ConfigError::new(
                    path,
                    format!("expected an array of tables, found {}", other.type_str()),
                ));
                Vec::new()
            }
        }
    }

    /// Report every key of this table that was never read.
    pub(crate) fn finish(self, errs: &mut Vec<ConfigError>) {
        for key in self.table.keys() {
            if !self.used.contains(key.as_str()) {
                errs.push(ConfigError::new(
                    self.key_path(key),
                    "unknown key".to_string(),
                ));
            }
        }
    }
}
