//! A model's identity, as profile and policy files record it.

use kvq_model::gemma3::Gemma3Config;
use kvq_model::gguf::{Gguf, GgufError, Value};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// What a profile or policy file must match: architecture, shapes and a metadata hash.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelIdentity {
    /// `general.architecture`.
    pub architecture: String,
    /// Decoder layers.
    pub layers: usize,
    /// KV heads per layer.
    pub kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// SHA-256 (hex) over the sorted tensor names, shapes and types and every metadata entry.
    pub metadata_sha256: String,
}

impl ModelIdentity {
    /// The identity of a loaded GGUF file.
    pub fn of(g: &Gguf) -> Result<Self, GgufError> {
        let c = Gemma3Config::from_gguf(g)?;
        let mut h = Sha256::new();
        for (name, t) in &g.tensors {
            h.update(format!("tensor {name} {:?} {}\n", t.dims, t.dtype.name()));
        }
        for (key, value) in &g.metadata {
            h.update(format!("meta {key} = "));
            hash_value(&mut h, value);
            h.update("\n");
        }
        Ok(Self {
            architecture: g.get_str("general.architecture")?.to_string(),
            layers: c.layers,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
            metadata_sha256: hex(&h.finalize()),
        })
    }

    /// The first field that differs from `other`, as `(name, self's value, other's value)`.
    pub fn difference(&self, other: &Self) -> Option<(&'static str, String, String)> {
        let fields = [
            (
                "architecture",
                self.architecture.clone(),
                other.architecture.clone(),
            ),
            ("layers", self.layers.to_string(), other.layers.to_string()),
            (
                "kv_heads",
                self.kv_heads.to_string(),
                other.kv_heads.to_string(),
            ),
            (
                "head_dim",
                self.head_dim.to_string(),
                other.head_dim.to_string(),
            ),
            (
                "metadata_sha256",
                self.metadata_sha256.clone(),
                other.metadata_sha256.clone(),
            ),
        ];
        fields.into_iter().find(|(_, a, b)| a != b)
    }
}

fn hash_value(h: &mut Sha256, v: &Value) {
    match v {
        Value::Int(i) => h.update(format!("i{i}")),
        Value::UInt(u) => h.update(format!("u{u}")),
        Value::Float(f) => h.update(format!("f{:016x}", f.to_bits())),
        Value::Bool(b) => h.update(format!("b{b}")),
        Value::Str(s) => {
            h.update(format!("s{}:", s.len()));
            h.update(s.as_bytes());
        }
        Value::Array(items) => {
            h.update(format!("a{}[", items.len()));
            items.iter().for_each(|i| hash_value(h, i));
            h.update("]");
        }
    }
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
