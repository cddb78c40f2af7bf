//! KIVI (Liu et al., ICML 2024): `kivi2` and `kivi4`, asymmetric uniform quantization with keys
//! grouped per channel and values per token (methods.md §3), with group size `G` = 32
//! (`kivi4`, `kivi2`), 64 or 128 (`kivi4-g64`, `kivi2-g128`, …).
//!
//! * **Keys**: a block holds `G` tokens. Each channel has its own f16 scale and f16 minimum over
//!   those tokens. Layout: `head_dim × (scale f16, min f16)`, then `G` rows of `b·head_dim/8`
//!   bytes of `b`-bit codes (least significant bit first). Bits per element:
//!   `(4·d + G·b·d/8)·8 / (G·d) = b + 32/G`.
//! * **Values**: a block holds one token, in groups of `G` channels, each with an f16 scale and
//!   f16 minimum. Layout: `(d/G) × (scale f16, min f16)`, then `b·d/8` bytes of codes. Bits per
//!   element: `b + 32/G`.
//!
//! So `kivi2` costs 3 bits and `kivi4` 5 bits per element at every head size; `kivi4-g128`
//! 4.25. The codec is the uniform engine of [`crate::uniform`] with these two layouts: the
//! quantizer, rounding and fused kernels are shared with `int{b}`.
//!
//! KIVI's full-precision recent window (R = 128 tokens in the paper) is not part of the codec:
//! the cache keeps the newest tokens in full precision and hands a block to this codec once `G`
//! key rows (or one value row) leave the window. Its share of the memory is counted by the
//! cache. A larger `G` has cheaper parameters but coarser key scales and a longer partial block.

use crate::uniform::{Grouping, IntCodec, ZeroPoint};
use crate::{CodecError, Role};

/// Builds `kivi{bits}` (`bits` = 2 or 4) with group `group` (tokens per key block, channels
/// per value group) for `role` at `head_dim` (a multiple of 8 for keys, of `group` for values).
pub fn kivi_codec(
    bits: u8,
    group: usize,
    role: Role,
    head_dim: usize,
) -> Result<IntCodec, CodecError> {
    let name = if group == 32 {
        format!("kivi{bits}")
    } else {
        format!("kivi{bits}-g{group}")
    };
    if !matches!(bits, 2 | 4) || !matches!(group, 32 | 64 | 128) {
        return Err(CodecError::UnknownScheme {
            name,
            known: "kivi2, kivi4, with -g64 or -g128".into(),
        });
    }
    let grouping = match role {
        Role::Key => Grouping::PerChannel { tokens: group },
        Role::Value => Grouping::PerToken { group },
    };
    IntCodec::with_layout(
        name,
        u32::from(bits),
        ZeroPoint::Asymmetric,
        grouping,
        head_dim,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Codec;

    #[test]
    fn bits_are_b_plus_32_over_the_group_for_both_roles() {
        for (bits, group, expected) in [
            (2u8, 32, 3.0),
            (4, 32, 5.0),
            (4, 64, 4.5),
            (4, 128, 4.25),
            (2, 128, 2.25),
        ] {
            for d in [128, 256] {
                for role in [Role::Key, Role::Value] {
                    let c = kivi_codec(bits, group, role, d).unwrap();
                    assert_eq!(
                        c.bits_per_element(),
                        expected,
                        "kivi{bits}-g{group} {role:?} {d}"
                    );
                }
            }
        }
        assert_eq!(kivi_codec(4, 32, Role::Key, 64).unwrap().block_tokens(), 32);
        assert_eq!(
            kivi_codec(4, 128, Role::Key, 64).unwrap().block_tokens(),
            128
        );
        assert_eq!(
            kivi_codec(4, 32, Role::Value, 64).unwrap().block_tokens(),
            1
        );
        assert!(kivi_codec(4, 32, Role::Value, 48).is_err());
        assert!(kivi_codec(4, 128, Role::Value, 64).is_err());
        assert!(kivi_codec(3, 32, Role::Key, 64).is_err());
        assert!(kivi_codec(4, 48, Role::Key, 64).is_err());
    }

    #[test]
    fn keys_are_scaled_per_channel() {
        // Channel c holds t·2^c over tokens t = 0..32; min 0, so scale_c = 31·2^c/15
        // rounded up to f16. A huge channel must not coarsen the others (as a per-token scale
        // would): channel 0's step stays below 31/15.
        let d = 8;
        let c = kivi_codec(4, 32, Role::Key, d).unwrap();
        let rows: Vec<f32> = (0..32 * d)
            .map(|i| (i / d) as f32 * (1u32 << (i % d)) as f32)
            .collect();
        let mut block = vec![0u8; c.block_bytes()];
        c.encode(&rows, &mut block).unwrap();
        for ch in 0..d {
            let scale = crate::uniform::read_f16(&block, 4 * ch);
            let min = crate::uniform::read_f16(&block, 4 * ch + 2);
            let exact = 31.0 * (1u32 << ch) as f32 / 15.0;
            assert_eq!(min, 0.0);
            assert!(scale >= exact && scale <= exact * 1.001, "{ch}: {scale}");
        }
        let mut back = vec![0.0; rows.len()];
        c.decode(&block, &mut back);
        for (i, (x, y)) in rows.iter().zip(&back).enumerate() {
            let step = crate::uniform::read_f16(&block, 4 * (i % d));
            assert!((x - y).abs() <= step / 2.0 * 1.0001, "{i}: {x} {y}");
        }
    }
}
