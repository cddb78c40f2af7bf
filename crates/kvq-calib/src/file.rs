//! The envelope of profile and policy files (design.md §4.3):
//!
//! ```json
//! { "format": "kvq-profile", "version": 1, "model": { ModelIdentity },
//!   "checksum": "sha256:…", "content": { … } }
//! ```
//!
//! The checksum is SHA-256 over the compact JSON of `[model, content]`. Reading checks, in
//! order, that the text is JSON, the format name, the version, the checksum, the model, and
//! finally that the content parses and passes the caller's validation; the caller gets the
//! content only when every check passed, so a bad file is never half-applied.

use crate::identity::{hex, ModelIdentity};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// Why a profile or policy file was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FileError {
    /// Not a file of the expected kind.
    #[error("not a {expected} file (format is {found:?})")]
    WrongFormat {
        /// The format name expected.
        expected: String,
        /// The format name found (empty if none).
        found: String,
    },
    /// A version this build does not read.
    #[error("{format} version {found} is not supported (this kvq reads version {supported}); recreate the file with this kvq")]
    OtherVersion {
        /// File format.
        format: String,
        /// Version in the file.
        found: u64,
        /// Version this build reads.
        supported: u64,
    },
    /// The file was changed or damaged after it was written.
    #[error("corrupt {format} file: {why}")]
    Corrupt {
        /// File format.
        format: String,
        /// What is wrong.
        why: String,
    },
    /// The file was made for another model.
    #[error("{format} file was made for another model: {field} is {file} in the file but {model} in the loaded model")]
    OtherModel {
        /// File format.
        format: String,
        /// The first identity field that differs.
        field: String,
        /// Its value in the file.
        file: String,
        /// Its value in the loaded model.
        model: String,
    },
}

/// Serializes `value` to JSON that parses back to JSON with the same text, so that the
/// checksum computed at writing equals the one computed at reading.
fn canonical(value: Value) -> Value {
    let mut v = value;
    for _ in 0..4 {
        let text = v.to_string();
        let back: Value = serde_json::from_str(&text).expect("serde_json reads its own output");
        let again = back.to_string();
        if again == text {
            return back;
        }
        v = back;
    }
    v
}

fn checksum(model: &Value, content: &Value) -> String {
    let digest = Sha256::digest(json!([model, content]).to_string());
    format!("sha256:{}", hex(&digest))
}

/// The text of a file of `format`/`version` for `model` holding `content`.
pub fn write<T: Serialize>(
    format: &str,
    version: u64,
    model: &ModelIdentity,
    content: &T,
) -> String {
    let model = canonical(serde_json::to_value(model).expect("identity serializes"));
    let content = canonical(serde_json::to_value(content).expect("file content serializes"));
    let sum = checksum(&model, &content);
    let file = json!({
        "format": format,
        "version": version,
        "model": model,
        "checksum": sum,
        "content": content,
    });
    serde_json::to_string_pretty(&file).expect("JSON values serialize") + "\n"
}

/// Reads a file of `format`/`version` for `model`; `validate` checks the parsed content
/// (returning why it is unusable). Nothing is returned unless every check passed.
pub fn read<T: DeserializeOwned>(
    text: &str,
    format: &str,
    version: u64,
    model: &ModelIdentity,
    validate: impl FnOnce(&T) -> Result<(), String>,
) -> Result<T, FileError> {
    let corrupt = |why: String| FileError::Corrupt {
        format: format.into(),
        why,
    };
    let file: Value =
        serde_json::from_str(text).map_err(|e| corrupt(format!("not valid JSON ({e})")))?;
    let found = file.get("format").and_then(Value::as_str).unwrap_or("");
    if found != format {
        return Err(FileError::WrongFormat {
            expected: format.into(),
            found: found.into(),
        });
    }
    match file.get("version").and_then(Value::as_u64) {
        Some(v) if v == version => {}
        Some(v) => {
            return Err(FileError::OtherVersion {
                format: format.into(),
                found: v,
                supported: version,
            })
        }
        None => return Err(corrupt("no version number".into())),
    }
    let (Some(file_model), Some(content)) = (file.get("model"), file.get("content")) else {
        return Err(corrupt("model or content missing".into()));
    };
    let stored = file.get("checksum").and_then(Value::as_str).unwrap_or("");
    let computed = checksum(file_model, content);
    if stored != computed {
        return Err(corrupt(format!(
            "checksum mismatch (file says {stored:?}, content hashes to {computed})"
        )));
    }
    let file_model: ModelIdentity = serde_json::from_value(file_model.clone())
        .map_err(|e| corrupt(format!("model identity: {e}")))?;
    if let Some((field, in_file, in_model)) = file_model.difference(model) {
        return Err(FileError::OtherModel {
            format: format.into(),
            field: field.into(),
            file: in_file,
            model: in_model,
        });
    }
    let content: T =
        serde_json::from_value(content.clone()).map_err(|e| corrupt(format!("content: {e}")))?;
    validate(&content).map_err(corrupt)?;
    Ok(content)
}
