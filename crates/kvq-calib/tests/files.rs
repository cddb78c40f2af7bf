//! Profile and policy files: round trips, refusals (other model, other version, corrupt), and
//! the threshold convergence rule.

use kvq_cache::{LayerSchemes, Policy};
use kvq_calib::profile::{converged, threshold_change, Profiler};
use kvq_calib::{FileError, ModelIdentity, PolicyFile, Profile};
use kvq_codec::SchemeKind;

const LAYERS: usize = 3;
const HEADS: usize = 2;
const DIM: usize = 16;

fn identity() -> ModelIdentity {
    ModelIdentity {
        architecture: "gemma3".into(),
        layers: LAYERS,
        kv_heads: HEADS,
        head_dim: DIM,
        metadata_sha256: "ab".repeat(32),
    }
}

/// Deterministic rows: `HEADS` blocks of `tokens × DIM`, channel 3 an outlier channel.
fn rows(tokens: usize, seed: u32) -> Vec<f32> {
    (0..HEADS * tokens * DIM)
        .map(|i| {
            let x = ((i as u32)
                .wrapping_mul(2654435761)
                .wrapping_add(seed * 7919)
                % 1000) as f32
                / 500.0
                - 1.0;
            if i % DIM == 3 {
                20.0 * x
            } else {
                x
            }
        })
        .collect()
}

fn profile(samples: u32) -> Profile {
    let mut p = Profiler::new(LAYERS, HEADS, DIM, 8);
    for s in 0..samples {
        let sample: Vec<_> = (0..LAYERS as u32)
            .map(|l| (rows(8, s + l), rows(8, s + 100 + l)))
            .collect();
        p.add_sample(&sample);
    }
    p.profile(false)
}

#[test]
fn profile_round_trip() {
    let p = profile(3);
    assert_eq!(
        p.layers[0].k.outlier_channels[0], 3,
        "the outlier channel ranks first"
    );
    assert_eq!(p.layers[0].k.outlier_channels.len(), DIM / 2);
    let text = p.to_file(&identity());
    let back = Profile::from_file(&text, &identity()).expect("own file reads back");
    assert_eq!(back, p);
    let cal = back.calibration();
    assert_eq!(cal.len(), LAYERS);
    let t = cal[1].0.oaken_thresholds.expect("thresholds");
    assert!(t.lo_outer < t.lo_inner && t.lo_inner < t.hi_inner && t.hi_inner < t.hi_outer);
    assert_eq!(cal[2].1.channel_scales.as_ref().map(Vec::len), Some(DIM));
}

#[test]
fn profile_of_another_model_is_refused() {
    let text = profile(2).to_file(&identity());
    let mut other = identity();
    other.metadata_sha256 = "cd".repeat(32);
    let err = Profile::from_file(&text, &other).unwrap_err();
    assert!(
        matches!(&err, FileError::OtherModel { field, .. } if field == "metadata_sha256"),
        "{err}"
    );
    assert!(err.to_string().contains("another model"), "{err}");
    let mut fewer = identity();
    fewer.layers = 2;
    assert!(
        matches!(Profile::from_file(&text, &fewer), Err(FileError::OtherModel { field, .. }) if field == "layers")
    );
}

#[test]
fn profile_of_another_version_is_refused() {
    let text = profile(2)
        .to_file(&identity())
        .replacen("\"version\": 1", "\"version\": 2", 1);
    let err = Profile::from_file(&text, &identity()).unwrap_err();
    assert!(
        matches!(
            err,
            FileError::OtherVersion {
                found: 2,
                supported: 1,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn corrupt_profile_is_refused() {
    let text = profile(2).to_file(&identity());
    // Change one digit of one statistic: the checksum no longer matches.
    let at = text.find("\"fp8_scale\": ").unwrap() + "\"fp8_scale\": ".len() + 2;
    let mut bytes = text.into_bytes();
    bytes[at] = if bytes[at] == b'7' { b'8' } else { b'7' };
    let err = Profile::from_file(std::str::from_utf8(&bytes).unwrap(), &identity()).unwrap_err();
    assert!(
        matches!(&err, FileError::Corrupt { why, .. } if why.contains("checksum")),
        "{err}"
    );
    // Truncated files and other formats are refused too.
    let text = profile(2).to_file(&identity());
    assert!(matches!(
        Profile::from_file(&text[..text.len() / 2], &identity()),
        Err(FileError::Corrupt { .. })
    ));
    let policy = PolicyFile::new(&Policy { layers: vec![] }, String::new()).to_file(&identity());
    assert!(matches!(
        Profile::from_file(&policy, &identity()),
        Err(FileError::WrongFormat { .. })
    ));
}

#[test]
fn policy_round_trip_and_refusals() {
    let schemes = LayerSchemes {
        k: SchemeKind::Q8_0,
        v: SchemeKind::Turbo { half_bits: 4 },
    };
    let policy = Policy {
        layers: vec![schemes; LAYERS],
    };
    let text = PolicyFile::new(&policy, "test".into()).to_file(&identity());
    assert_eq!(PolicyFile::from_file(&text, &identity()).unwrap(), policy);
    let mut other = identity();
    other.head_dim = 32;
    assert!(matches!(
        PolicyFile::from_file(&text, &other),
        Err(FileError::OtherModel { .. })
    ));
    let tampered = text.replacen("\"q8_0\"", "\"q4_0\"", 1);
    assert!(matches!(
        PolicyFile::from_file(&tampered, &identity()),
        Err(FileError::Corrupt { .. })
    ));
    // A correctly checksummed file with the wrong number of layers is refused as a whole.
    let short = Policy {
        layers: vec![schemes; LAYERS - 1],
    };
    let text = PolicyFile::new(&short, String::new()).to_file(&identity());
    assert!(matches!(
        PolicyFile::from_file(&text, &identity()),
        Err(FileError::Corrupt { .. })
    ));
}

#[test]
fn threshold_convergence_rule() {
    let before = profile(4);
    let mut close = before.clone();
    close.samples += 1;
    let spread = close.layers[1].v.oaken[3] - close.layers[1].v.oaken[0];
    close.layers[1].v.oaken[2] += 0.0005 * spread;
    assert!(threshold_change(&before, &close) < 1e-3);
    assert!(converged(&before, &close), "a 0.05% move converges");
    let mut far = close.clone();
    far.layers[2].k.oaken[1] += 0.002 * (far.layers[2].k.oaken[3] - far.layers[2].k.oaken[0]);
    assert!(!converged(&before, &far), "a 0.2% move does not");
    // One sample is never enough, however little it moved.
    let mut first = before.clone();
    first.samples = 1;
    assert!(!converged(&first, &first));
    // Averaging the same data again does not move the thresholds at all.
    let (a, b) = (profile(1), profile(1));
    assert_eq!(threshold_change(&a, &b), 0.0);
}

/// The profile records each channel's mean, and the calibration carries it as channel means.
#[test]
fn profile_records_channel_means() {
    let p = profile(2);
    let mut sum = [0f64; DIM];
    for s in 0..2 {
        for row in rows(8, s).chunks_exact(DIM) {
            for (c, &x) in row.iter().enumerate() {
                sum[c] += f64::from(x);
            }
        }
    }
    let tokens = (2 * HEADS * 8) as f64;
    for (c, &m) in p.layers[0].k.channel_mean.iter().enumerate() {
        assert!((f64::from(m) - sum[c] / tokens).abs() < 1e-5, "channel {c}");
    }
    let cal = p.calibration();
    assert_eq!(
        cal[0].0.channel_means.as_ref(),
        Some(&p.layers[0].k.channel_mean)
    );
    assert!(
        !cal[0].0.channel_norm,
        "normalization is the caller's choice"
    );
}

/// A profile written before channel means were recorded still reads (same version, valid
/// checksum) and simply carries no means; means of the wrong length are refused.
#[test]
fn profile_without_channel_means_still_reads() {
    let p = profile(2);
    let mut content = serde_json::to_value(&p).unwrap();
    for layer in content["layers"].as_array_mut().unwrap() {
        for role in ["k", "v"] {
            layer[role].as_object_mut().unwrap().remove("channel_mean");
        }
    }
    let text = kvq_calib::file::write(
        kvq_calib::profile::FORMAT,
        kvq_calib::profile::VERSION,
        &identity(),
        &content,
    );
    let old = Profile::from_file(&text, &identity()).expect("old profile reads");
    assert!(old.layers[1].v.channel_mean.is_empty());
    assert_eq!(old.calibration()[1].0.channel_means, None);

    let mut short = p.clone();
    short.layers[2].k.channel_mean.pop();
    let err = Profile::from_file(&short.to_file(&identity()), &identity()).unwrap_err();
    assert!(err.to_string().contains("channel means"), "{err}");
}
