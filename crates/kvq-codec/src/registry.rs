//! The scheme registry: names of design.md §4.1, parsing, and construction of codecs.
//! Adding a scheme means one codec module and one line in each table here.

use crate::{Calibration, Codec, CodecError, Role};

/// A KV scheme as named on the command line (without per-layer or per-role choices).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SchemeKind {
    /// 32-bit float.
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
    /// FP8 E4M3 (`fp8`, `fp8-e4m3`).
    Fp8E4M3,
    /// FP8 E5M2.
    Fp8E5M2,
    /// 8-bit integers: keys with per-channel scales, values with per-token scales.
    Int8,
    /// Per-token asymmetric `bits`-bit groups of `group` channels along head_dim.
    Int { bits: u8, group: u16 },
    /// llama.cpp `q8_0`.
    Q8_0,
    /// llama.cpp `q4_0`.
    Q4_0,
    /// llama.cpp `q4_1`.
    Q4_1,
    /// llama.cpp `q5_0`.
    Q5_0,
    /// llama.cpp `q5_1`.
    Q5_1,
    /// llama.cpp `iq4_nl`.
    Iq4Nl,
    /// KIVI with 2 or 4 bits and a group of 32, 64 or 128 (tokens per key block, channels
    /// per value group).
    Kivi { bits: u8, group: u16 },
    /// Oaken (online half; thresholds from a profile).
    Oaken,
    /// TurboQuant-mse at `half_bits / 2` bits per coordinate (4, 5, 6, 7, 8 → 2, 2.5, 3, 3.5, 4).
    Turbo { half_bits: u8 },
    /// TurboQuant-prod at `bits` bits per coordinate (`bits − 1` MSE bits + 1 QJL bit).
    TurboProd { bits: u8 },
}

/// Every scheme name `parse` accepts (group-size variants of `int2|3|4` included).
pub fn scheme_names() -> Vec<String> {
    let mut names: Vec<String> = ["f32", "f16", "bf16", "fp8", "fp8-e5m2", "int8"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for bits in [4, 3, 2] {
        names.push(format!("int{bits}"));
        for g in [32, 64, 128] {
            names.push(format!("int{bits}-g{g}"));
        }
    }
    names.extend(
        [
            "q8_0",
            "q4_0",
            "q4_1",
            "q5_0",
            "q5_1",
            "iq4_nl",
            "kivi4",
            "kivi4-g64",
            "kivi4-g128",
            "kivi2",
            "kivi2-g64",
            "kivi2-g128",
            "oaken",
            "turbo4",
            "turbo3.5",
            "turbo3",
            "turbo2.5",
            "turbo2",
            "turbo4-prod",
            "turbo3-prod",
            "turbo2-prod",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    names
}

impl SchemeKind {
    /// Parses a scheme name (case-insensitive); unknown names list the known ones.
    pub fn parse(name: &str) -> Result<Self, CodecError> {
        let lower = name.trim().to_ascii_lowercase();
        let kind = match lower.as_str() {
            "f32" => Self::F32,
            "f16" => Self::F16,
            "bf16" => Self::Bf16,
            "fp8" | "fp8-e4m3" => Self::Fp8E4M3,
            "fp8-e5m2" => Self::Fp8E5M2,
            "int8" => Self::Int8,
            "q8_0" => Self::Q8_0,
            "q4_0" => Self::Q4_0,
            "q4_1" => Self::Q4_1,
            "q5_0" => Self::Q5_0,
            "q5_1" => Self::Q5_1,
            "iq4_nl" => Self::Iq4Nl,
            "oaken" => Self::Oaken,
            "turbo2" => Self::Turbo { half_bits: 4 },
            "turbo2.5" => Self::Turbo { half_bits: 5 },
            "turbo3" => Self::Turbo { half_bits: 6 },
            "turbo3.5" => Self::Turbo { half_bits: 7 },
            "turbo4" => Self::Turbo { half_bits: 8 },
            "turbo2-prod" => Self::TurboProd { bits: 2 },
            "turbo3-prod" => Self::TurboProd { bits: 3 },
            "turbo4-prod" => Self::TurboProd { bits: 4 },
            other => parse_grouped(other).ok_or_else(|| CodecError::UnknownScheme {
                name: name.to_string(),
                known: scheme_names().join(", "),
            })?,
        };
        Ok(kind)
    }

    /// The canonical name of this scheme.
    pub fn name(&self) -> String {
        match *self {
            Self::F32 => "f32".into(),
            Self::F16 => "f16".into(),
            Self::Bf16 => "bf16".into(),
            Self::Fp8E4M3 => "fp8".into(),
            Self::Fp8E5M2 => "fp8-e5m2".into(),
            Self::Int8 => "int8".into(),
            Self::Int { bits, group } => format!("int{bits}-g{group}"),
            Self::Q8_0 => "q8_0".into(),
            Self::Q4_0 => "q4_0".into(),
            Self::Q4_1 => "q4_1".into(),
            Self::Q5_0 => "q5_0".into(),
            Self::Q5_1 => "q5_1".into(),
            Self::Iq4Nl => "iq4_nl".into(),
            Self::Kivi { bits, group: 32 } => format!("kivi{bits}"),
            Self::Kivi { bits, group } => format!("kivi{bits}-g{group}"),
            Self::Oaken => "oaken".into(),
            Self::Turbo { half_bits } if half_bits % 2 == 0 => format!("turbo{}", half_bits / 2),
            Self::Turbo { half_bits } => format!("turbo{}.5", half_bits / 2),
            Self::TurboProd { bits } => format!("turbo{bits}-prod"),
        }
    }

    /// Whether this is a 16/32-bit float scheme (no quantization).
    pub fn is_full_precision(&self) -> bool {
        matches!(self, Self::F32 | Self::F16 | Self::Bf16)
    }
}

/// `int{2,3,4}[-gG]` (default group 64) and `kivi{2,4}[-gG]` (default group 32), `G` ∈
/// {32, 64, 128}.
fn parse_grouped(name: &str) -> Option<SchemeKind> {
    let (family, default_group) = if name.starts_with("int") {
        ("int", 64)
    } else {
        ("kivi", 32)
    };
    let rest = name.strip_prefix(family)?;
    let (bits, group) = match rest.split_once("-g") {
        Some((b, g)) => (b, g.parse::<u16>().ok()?),
        None => (rest, default_group),
    };
    let bits: u8 = bits.parse().ok()?;
    if !matches!(group, 32 | 64 | 128) {
        return None;
    }
    match family {
        "int" if matches!(bits, 2..=4) => Some(SchemeKind::Int { bits, group }),
        "kivi" if matches!(bits, 2 | 4) => Some(SchemeKind::Kivi { bits, group }),
        _ => None,
    }
}

/// A `--kv` value: one scheme for keys and one for values (`KIND` or `k=KIND,v=KIND`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KvSpec {
    /// Scheme for keys.
    pub k: SchemeKind,
    /// Scheme for values.
    pub v: SchemeKind,
}

impl KvSpec {
    /// Parses `KIND` or `k=KIND,v=KIND`.
    pub fn parse(spec: &str) -> Result<Self, CodecError> {
        let spec = spec.trim();
        if let Some((k, v)) = spec.split_once(',') {
            let k = k.trim();
            let v = v.trim();
            let (Some(k), Some(v)) = (k.strip_prefix("k="), v.strip_prefix("v=")) else {
                return Err(CodecError::UnknownScheme {
                    name: spec.to_string(),
                    known: "KIND or k=KIND,v=KIND with KIND one of ".to_string()
                        + &scheme_names().join(", "),
                });
            };
            return Ok(Self {
                k: SchemeKind::parse(k)?,
                v: SchemeKind::parse(v)?,
            });
        }
        let kind = SchemeKind::parse(spec)?;
        Ok(Self { k: kind, v: kind })
    }

    /// Canonical text form (`KIND` when both agree).
    pub fn name(&self) -> String {
        if self.k == self.v {
            self.k.name()
        } else {
            format!("k={},v={}", self.k.name(), self.v.name())
        }
    }
}

impl std::fmt::Display for KvSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// Builds the codec for `kind` at `head_dim` in `role`. `seed` fixes the random rotations of
/// TurboQuant; `calibration` feeds the schemes that use offline statistics.
///
/// With [`Calibration::channel_norm`], a quantized scheme is wrapped in
/// [`normalized::ChannelNorm`](crate::normalized::ChannelNorm): the inner codec sees centered,
/// unit-spread channels, so it is built without the statistics of raw values (channel scales,
/// FP8 scale); Oaken, whose thresholds are quantiles of raw values, refuses it, and 16/32-bit
/// floats are left unwrapped (they gain nothing).
pub fn build_codec(
    kind: SchemeKind,
    role: Role,
    head_dim: usize,
    calibration: &Calibration,
    seed: u64,
) -> Result<Box<dyn Codec>, CodecError> {
    if !calibration.channel_norm || kind.is_full_precision() {
        return build_plain(kind, role, head_dim, calibration, seed);
    }
    if kind == SchemeKind::Oaken {
        return Err(CodecError::InvalidCalibration {
            scheme: kind.name(),
            why: "channel normalization does not apply: Oaken's thresholds are quantiles of raw \
                  values"
                .into(),
        });
    }
    let (means, scales) =
        crate::normalized::ChannelNorm::statistics(calibration, head_dim, &kind.name())?;
    let inner = Calibration {
        outlier_channels: calibration.outlier_channels.clone(),
        ..Default::default()
    };
    let inner = build_plain(kind, role, head_dim, &inner, seed)?;
    Ok(Box::new(crate::normalized::ChannelNorm::new(
        inner, means, scales,
    )?))
}

/// [`build_codec`] without channel normalization.
fn build_plain(
    kind: SchemeKind,
    role: Role,
    head_dim: usize,
    calibration: &Calibration,
    seed: u64,
) -> Result<Box<dyn Codec>, CodecError> {
    use crate::*;
    Ok(match kind {
        SchemeKind::F32 => Box::new(float::FloatCodec::new(float::FloatFormat::F32, head_dim)),
        SchemeKind::F16 => Box::new(float::FloatCodec::new(float::FloatFormat::F16, head_dim)),
        SchemeKind::Bf16 => Box::new(float::FloatCodec::new(float::FloatFormat::Bf16, head_dim)),
        SchemeKind::Fp8E4M3 => Box::new(fp8::Fp8Codec::new(
            fp8::Fp8Format::E4M3,
            head_dim,
            calibration.fp8_scale,
        )?),
        SchemeKind::Fp8E5M2 => Box::new(fp8::Fp8Codec::new(
            fp8::Fp8Format::E5M2,
            head_dim,
            calibration.fp8_scale,
        )?),
        SchemeKind::Int8 => Box::new(uniform::IntCodec::int8(role, head_dim)?),
        SchemeKind::Int { bits, group } => {
            Box::new(uniform::IntCodec::new(bits, group as usize, head_dim)?)
        }
        SchemeKind::Q8_0 => Box::new(ggml::GgmlCodec::new(ggml::GgmlType::Q8_0, head_dim)?),
        SchemeKind::Q4_0 => Box::new(ggml::GgmlCodec::new(ggml::GgmlType::Q4_0, head_dim)?),
        SchemeKind::Q4_1 => Box::new(ggml::GgmlCodec::new(ggml::GgmlType::Q4_1, head_dim)?),
        SchemeKind::Q5_0 => Box::new(ggml::GgmlCodec::new(ggml::GgmlType::Q5_0, head_dim)?),
        SchemeKind::Q5_1 => Box::new(ggml::GgmlCodec::new(ggml::GgmlType::Q5_1, head_dim)?),
        SchemeKind::Iq4Nl => Box::new(ggml::GgmlCodec::new(ggml::GgmlType::Iq4Nl, head_dim)?),
        SchemeKind::Kivi { bits, group } => {
            Box::new(kivi::kivi_codec(bits, usize::from(group), role, head_dim)?)
        }
        SchemeKind::Oaken => Box::new(oaken::OakenCodec::from_calibration(calibration, head_dim)?),
        SchemeKind::Turbo { half_bits } => Box::new(turbo::TurboCodec::mse(
            half_bits,
            head_dim,
            seed,
            calibration,
        )?),
        SchemeKind::TurboProd { bits } => Box::new(turbo::TurboCodec::prod(bits, head_dim, seed)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_name_parses_back_to_itself() {
        for name in scheme_names() {
            let kind = SchemeKind::parse(&name).unwrap();
            assert_eq!(SchemeKind::parse(&kind.name()).unwrap(), kind, "{name}");
        }
    }

    #[test]
    fn names_are_case_insensitive_and_int_defaults_to_g64() {
        assert_eq!(SchemeKind::parse("Q4_0").unwrap(), SchemeKind::Q4_0);
        assert_eq!(
            SchemeKind::parse("INT4").unwrap(),
            SchemeKind::Int { bits: 4, group: 64 }
        );
        assert_eq!(SchemeKind::parse("fp8-e4m3").unwrap(), SchemeKind::Fp8E4M3);
    }

    #[test]
    fn unknown_name_lists_known_ones() {
        let err = SchemeKind::parse("q3_k").unwrap_err().to_string();
        assert!(
            err.contains("q3_k") && err.contains("turbo3.5") && err.contains("kivi2"),
            "{err}"
        );
        assert!(SchemeKind::parse("int5").is_err());
        assert!(SchemeKind::parse("int4-g48").is_err());
    }

    #[test]
    fn kv_spec_splits_keys_and_values() {
        let spec = KvSpec::parse("k=q8_0,v=q4_0").unwrap();
        assert_eq!((spec.k, spec.v), (SchemeKind::Q8_0, SchemeKind::Q4_0));
        assert_eq!(spec.name(), "k=q8_0,v=q4_0");
        assert_eq!(KvSpec::parse("turbo3").unwrap().name(), "turbo3");
        assert!(KvSpec::parse("v=q4_0,k=q8_0").is_err());
    }
}
