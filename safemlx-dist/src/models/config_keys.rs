//! A Hugging Face `config.json`'s keys, read with errors that name the key
//! and the file: the reader of the Llama family's configuration and each
//! family file's own keys share it.

use serde_json::Value;

use crate::error::{Error, Result};

/// A `config.json`'s keys, read with errors that name the key and the
/// file.
pub(super) struct Keys<'a> {
    pub(super) json: &'a Value,
    pub(super) path: &'a str,
}

impl Keys<'_> {
    /// An error about this file.
    pub(super) fn fail(&self, message: String) -> Error {
        Error::Model {
            path: self.path.to_owned(),
            message,
        }
    }

    /// A whole number, if the key is there and not null.
    pub(super) fn int(&self, key: &str) -> Result<Option<usize>> {
        match self.json.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|v| usize::try_from(v).ok())
                .map(Some)
                .ok_or_else(|| self.fail(format!("\"{key}\" is {v}, not a whole number"))),
        }
    }

    /// A whole number above 0 that must be there.
    pub(super) fn need(&self, key: &str) -> Result<usize> {
        match self.int(key)? {
            Some(0) => Err(self.fail(format!("\"{key}\" is 0"))),
            Some(v) => Ok(v),
            None => Err(self.fail(format!("config.json has no \"{key}\""))),
        }
    }

    /// A number in `within` (the file, or an object in it).
    pub(super) fn float(&self, key: &str, within: &Value) -> Result<Option<f32>> {
        match within.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .map(|v| Some(v as f32))
                .ok_or_else(|| self.fail(format!("\"{key}\" is {v}, not a number"))),
        }
    }

    /// `true` or `false`, if the key is there and not null.
    pub(super) fn flag(&self, key: &str) -> Result<Option<bool>> {
        match self.json.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.fail(format!("\"{key}\" is {v}, not true or false"))),
        }
    }
}
