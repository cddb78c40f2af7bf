//! # kvq-calib
//!
//! The offline half of calibrated KV schemes, and per-layer tuning (design.md §3, part "calib").
//!
//! * [`identity`]: a model's identity (architecture, shapes, a hash of its GGUF metadata).
//! * [`mod@file`]: the envelope of profile and policy files (design.md §4.3): format name, version,
//!   model identity and checksum, checked before anything is applied.
//! * [`profile`]: `kvq calibrate` — per layer and role, Oaken's thresholds, per-channel scales,
//!   FP8 scales and TurboQuant's outlier channels, read back from an f32 cache.
//! * [`policy_file`]: per-layer K/V scheme files that `--kv-policy` applies.
//! * [`sensitivity`]: the quality cost of quantizing one layer's K or V alone, and its chart.
//! * [`tune`]: the per-layer choice that meets a KL-divergence or a bit budget.

pub mod file;
pub mod identity;
pub mod policy_file;
pub mod profile;
pub mod sensitivity;
pub mod tune;

pub use file::FileError;
pub use identity::ModelIdentity;
pub use policy_file::PolicyFile;
pub use profile::Profile;
