//! Packing of small unsigned codes (1–8 bits each) into bytes, least significant bit first.
//! Code `i` of width `b` occupies bits `i·b .. (i+1)·b` of the byte string.

/// Bytes needed for `count` codes of `bits` bits each.
pub fn packed_len(count: usize, bits: u32) -> usize {
    (count * bits as usize).div_ceil(8)
}

/// Writes `codes` (each `< 2^bits`) into `out`, which must be `packed_len` long; the padding
/// bits of the last byte are zero.
pub fn pack(codes: &[u8], bits: u32, out: &mut [u8]) {
    debug_assert!((1..=8).contains(&bits));
    out.fill(0);
    let mut bit = 0usize;
    for &c in codes {
        debug_assert!(u32::from(c) < (1u32 << bits));
        let (byte, shift) = (bit / 8, bit % 8);
        out[byte] |= c << shift;
        if shift + bits as usize > 8 {
            out[byte + 1] |= c >> (8 - shift);
        }
        bit += bits as usize;
    }
}

/// Reads code `i` of width `bits` from `packed`.
#[inline]
pub fn get(packed: &[u8], bits: u32, i: usize) -> u8 {
    let bit = i * bits as usize;
    let (byte, shift) = (bit / 8, bit % 8);
    let mut v = u16::from(packed[byte]) >> shift;
    if shift + bits as usize > 8 {
        v |= u16::from(packed[byte + 1]) << (8 - shift);
    }
    (v & ((1u16 << bits) - 1)) as u8
}

/// Reads `codes.len()` codes of width `bits` from `packed`.
pub fn unpack(packed: &[u8], bits: u32, codes: &mut [u8]) {
    for (i, c) in codes.iter_mut().enumerate() {
        *c = get(packed, bits, i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn pack_then_unpack_is_identity(bits in 1u32..=8, raw in proptest::collection::vec(any::<u8>(), 0..300)) {
            let codes: Vec<u8> = raw.iter().map(|c| ((*c as u32) & ((1 << bits) - 1)) as u8).collect();
            let mut packed = vec![0u8; packed_len(codes.len(), bits)];
            pack(&codes, bits, &mut packed);
            let mut back = vec![0u8; codes.len()];
            unpack(&packed, bits, &mut back);
            prop_assert_eq!(back, codes);
        }
    }

    #[test]
    fn three_bit_codes_straddle_bytes_lsb_first() {
        // codes 5 (101), 3 (011), 7 (111): bits 0..9 = 1,0,1, 1,1,0, 1,1,1
        let mut out = [0u8; 2];
        pack(&[5, 3, 7], 3, &mut out);
        assert_eq!(out, [0b1101_1101, 0b0000_0001]);
    }
}
