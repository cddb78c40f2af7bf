//! Per-layer K/V scheme files (`kvq tune` writes them, `--kv-policy` applies them).

use crate::file::{self, FileError};
use crate::identity::ModelIdentity;
use kvq_cache::{LayerSchemes, Policy};
use kvq_codec::SchemeKind;
use serde::{Deserialize, Serialize};

/// Format name of policy files.
pub const FORMAT: &str = "kvq-policy";
/// Version of policy files this build writes and reads.
pub const VERSION: u64 = 1;

/// The schemes of one layer, by name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerEntry {
    /// Key scheme.
    pub k: String,
    /// Value scheme.
    pub v: String,
}

/// A policy file's content.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PolicyFile {
    /// One entry per layer.
    pub layers: Vec<LayerEntry>,
    /// How the policy was made (free-form, e.g. the budget and the predicted KL divergence).
    #[serde(default)]
    pub note: String,
}

impl PolicyFile {
    /// The file content of `policy`.
    pub fn new(policy: &Policy, note: String) -> Self {
        Self {
            layers: policy
                .layers
                .iter()
                .map(|l| LayerEntry {
                    k: l.k.name(),
                    v: l.v.name(),
                })
                .collect(),
            note,
        }
    }

    /// The file text for `model`.
    pub fn to_file(&self, model: &ModelIdentity) -> String {
        file::write(FORMAT, VERSION, model, self)
    }

    /// Reads a policy file for `model`, refusing one of another model or version, a corrupt
    /// one, or one naming an unknown scheme.
    pub fn from_file(text: &str, model: &ModelIdentity) -> Result<Policy, FileError> {
        let mut policy = None;
        file::read(text, FORMAT, VERSION, model, |f: &PolicyFile| {
            if f.layers.len() != model.layers {
                return Err(format!(
                    "{} layers, the model has {}",
                    f.layers.len(),
                    model.layers
                ));
            }
            let parse = |s: &str| SchemeKind::parse(s).map_err(|e| e.to_string());
            let layers = f
                .layers
                .iter()
                .map(|l| {
                    Ok(LayerSchemes {
                        k: parse(&l.k)?,
                        v: parse(&l.v)?,
                    })
                })
                .collect::<Result<Vec<_>, String>>()?;
            policy = Some(Policy { layers });
            Ok(())
        })?;
        Ok(policy.expect("validated policy files are parsed"))
    }
}
