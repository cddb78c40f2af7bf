//! Bad model files are clear errors, never panics: truncated at every point, corrupt counts,
//! foreign files, unsupported versions, tensor types and architectures.

use kvq_model::gemma3::Gemma3Config;
use kvq_model::gguf::{write_gguf, Gguf, GgufError, TensorData, TensorType, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;

struct Temp(PathBuf);
impl Temp {
    fn with(name: &str, bytes: &[u8]) -> Self {
        let p = std::env::temp_dir().join(format!("kvq-gguf-{}-{name}", std::process::id()));
        std::fs::write(&p, bytes).unwrap();
        Self(p)
    }
}
impl Drop for Temp {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn open(name: &str, bytes: &[u8]) -> Result<Gguf, GgufError> {
    let t = Temp::with(name, bytes);
    Gguf::open(&t.0)
}

fn small_file() -> Vec<u8> {
    let mut meta = BTreeMap::new();
    meta.insert(
        "general.architecture".to_string(),
        Value::Str("gemma3".into()),
    );
    meta.insert("general.name".to_string(), Value::Str("tiny".into()));
    meta.insert(
        "tokenizer.ggml.scores".to_string(),
        Value::Array(vec![Value::Float(0.5); 3]),
    );
    let tensors = vec![
        TensorData {
            name: "a".into(),
            dims: vec![4],
            dtype: TensorType::F32,
            bytes: vec![0; 16],
        },
        TensorData {
            name: "b".into(),
            dims: vec![32, 2],
            dtype: TensorType::Q8_0,
            bytes: vec![0; 68],
        },
    ];
    write_gguf(&meta, &tensors)
}

#[test]
fn a_well_formed_file_reads_back() {
    let g = open("ok", &small_file()).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.get_str("general.name").unwrap(), "tiny");
    assert_eq!(g.tensor("b").unwrap().dims, vec![32, 2]);
    assert_eq!(g.tensor("b").unwrap().len, 68);
    assert_eq!(g.get_array("tokenizer.ggml.scores").unwrap().len(), 3);
}

#[test]
fn every_truncation_is_an_error_not_a_panic() {
    let bytes = small_file();
    // Past the end of the last tensor's data only alignment padding follows.
    let g = open("full", &bytes).unwrap();
    let data_end = g.tensors.values().map(|t| t.offset + t.len).max().unwrap();
    assert!(data_end < bytes.len());
    for cut in 0..data_end {
        let result =
            std::panic::catch_unwind(|| open(&format!("cut{cut}"), &bytes[..cut]).map(|_| ()));
        let result = result.unwrap_or_else(|_| panic!("panic when truncated at {cut}"));
        assert!(
            result.is_err(),
            "a file truncated at byte {cut} of {data_end} was accepted"
        );
    }
}

#[test]
fn flipped_bytes_never_panic() {
    let bytes = small_file();
    for at in 0..bytes.len().min(400) {
        for v in [0x00u8, 0xFF, 0x7F] {
            let mut b = bytes.clone();
            b[at] = v;
            let r = std::panic::catch_unwind(|| open(&format!("flip{at}-{v}"), &b).map(|_| ()));
            assert!(r.is_ok(), "panic with byte {at} set to {v:#x}");
        }
    }
}

#[test]
fn foreign_files_and_versions_are_named() {
    let err = open("text", b"hello, this is not a model").err().unwrap();
    assert!(err.to_string().contains("not a GGUF file"), "{err}");
    let mut v1 = small_file();
    v1[4..8].copy_from_slice(&1u32.to_le_bytes());
    let err = open("v1", &v1).err().unwrap();
    assert!(
        err.to_string().contains("unsupported GGUF version 1"),
        "{err}"
    );
    let err = open("empty", b"").err().unwrap();
    assert!(err.to_string().contains("not a GGUF file"), "{err}");
}

#[test]
fn unsupported_tensor_type_and_architecture_are_named() {
    let mut bytes = small_file();
    // Tensor "b"'s type id (Q8_0 = 8) follows its name and dims; make it IQ2_XXS (16).
    let name_at = bytes
        .windows(9)
        .position(|w| w == b"\x01\0\0\0\0\0\0\0b")
        .unwrap()
        + 9;
    let type_at = name_at + 4 + 2 * 8;
    assert_eq!(
        u32::from_le_bytes(bytes[type_at..type_at + 4].try_into().unwrap()),
        8
    );
    bytes[type_at..type_at + 4].copy_from_slice(&16u32.to_le_bytes());
    let err = open("iq2", &bytes).err().unwrap().to_string();
    assert!(err.contains("IQ2_XXS") && err.contains("tensor b"), "{err}");

    let mut meta = BTreeMap::new();
    meta.insert(
        "general.architecture".to_string(),
        Value::Str("mamba".into()),
    );
    let g = open("mamba", &write_gguf(&meta, &[])).unwrap();
    let err = Gemma3Config::from_gguf(&g).unwrap_err().to_string();
    assert!(err.contains("'mamba' is not supported"), "{err}");
}
