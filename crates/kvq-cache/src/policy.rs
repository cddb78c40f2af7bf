//! Which scheme stores each layer's keys and values.

use kvq_codec::{KvSpec, SchemeKind};

/// The K and V schemes of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerSchemes {
    /// Scheme for keys.
    pub k: SchemeKind,
    /// Scheme for values.
    pub v: SchemeKind,
}

/// A per-layer scheme assignment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// One entry per layer.
    pub layers: Vec<LayerSchemes>,
}

/// A policy that does not fit the model.
#[derive(Debug, thiserror::Error)]
#[error("policy has {policy_layers} layers but the model has {model_layers}")]
pub struct PolicyError {
    /// Layers in the policy.
    pub policy_layers: usize,
    /// Layers in the model.
    pub model_layers: usize,
}

impl Policy {
    /// The same `spec` for every one of `layers` layers.
    pub fn uniform(spec: KvSpec, layers: usize) -> Self {
        Self {
            layers: vec![
                LayerSchemes {
                    k: spec.k,
                    v: spec.v
                };
                layers
            ],
        }
    }

    /// Checks that the policy has one entry per model layer.
    pub fn check_layers(&self, model_layers: usize) -> Result<(), PolicyError> {
        if self.layers.len() == model_layers {
            Ok(())
        } else {
            Err(PolicyError {
                policy_layers: self.layers.len(),
                model_layers,
            })
        }
    }

    /// A short description: the scheme when uniform, else `mixed(N schemes)`.
    pub fn describe(&self) -> String {
        let first = self.layers.first().copied();
        match first {
            Some(f) if self.layers.iter().all(|l| *l == f) => KvSpec { k: f.k, v: f.v }.name(),
            _ => format!("mixed policy over {} layers", self.layers.len()),
        }
    }
}
