//! A reader for GGUF files (versions 2 and 3): header, metadata and tensor directory, with the
//! tensor data memory-mapped. Every length and offset is checked against the file, so a
//! truncated, corrupt or foreign file is a [`GgufError`] naming the problem, never a panic.

use memmap2::Mmap;
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

/// Errors found while reading a GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be opened or mapped.
    #[error("cannot read {path}: {source}")]
    Io {
        /// File path.
        path: PathBuf,
        /// Underlying error.
        source: std::io::Error,
    },
    /// The file does not start with the GGUF magic.
    #[error("{path} is not a GGUF file (first bytes {magic:02x?}, expected \"GGUF\")")]
    NotGguf {
        /// File path.
        path: PathBuf,
        /// The first bytes found.
        magic: Vec<u8>,
    },
    /// A GGUF version other than 2 or 3.
    #[error("unsupported GGUF version {0} (kvq reads versions 2 and 3)")]
    UnsupportedVersion(u32),
    /// The file ends inside a structure.
    #[error("GGUF file is truncated: {what} needs bytes {start}..{end} but the file has {len}")]
    Truncated {
        /// What was being read.
        what: String,
        /// Start offset.
        start: u64,
        /// End offset.
        end: u64,
        /// File length.
        len: u64,
    },
    /// A structure holds an impossible value.
    #[error("corrupt GGUF file: {0}")]
    Corrupt(String),
    /// A tensor type that kvq cannot compute with.
    #[error("tensor {tensor} has type {type_name} (ggml type id {type_id}), which kvq does not support; supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K")]
    UnsupportedTensorType {
        /// Tensor name.
        tensor: String,
        /// ggml type id.
        type_id: u32,
        /// ggml type name, where known.
        type_name: String,
    },
    /// A metadata key the model needs is missing or has the wrong type.
    #[error("GGUF metadata key {key}: {problem}")]
    Metadata {
        /// The key.
        key: String,
        /// What is wrong.
        problem: String,
    },
    /// A tensor the model needs is missing or has the wrong shape.
    #[error("tensor {name}: {problem}")]
    Tensor {
        /// Tensor name.
        name: String,
        /// What is wrong.
        problem: String,
    },
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// Any unsigned or signed integer type, widened.
    Int(i64),
    /// u64 values above `i64::MAX`.
    UInt(u64),
    /// f32 or f64.
    Float(f64),
    /// bool.
    Bool(bool),
    /// UTF-8 string (invalid UTF-8 replaced).
    Str(String),
    /// An array of values.
    Array(Vec<Value>),
}

impl Value {
    fn type_name(&self) -> &'static str {
        match self {
            Value::Int(_) | Value::UInt(_) => "integer",
            Value::Float(_) => "float",
            Value::Bool(_) => "bool",
            Value::Str(_) => "string",
            Value::Array(_) => "array",
        }
    }
}

/// Tensor element types kvq reads (ggml's type ids).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TensorType {
    /// f32.
    F32,
    /// f16.
    F16,
    /// bf16.
    Bf16,
    /// Q4_0 (18 bytes per 32).
    Q4_0,
    /// Q4_1 (20 bytes per 32).
    Q4_1,
    /// Q5_0 (22 bytes per 32).
    Q5_0,
    /// Q5_1 (24 bytes per 32).
    Q5_1,
    /// Q8_0 (34 bytes per 32).
    Q8_0,
    /// Q4_K (144 bytes per 256).
    Q4K,
    /// Q5_K (176 bytes per 256).
    Q5K,
    /// Q6_K (210 bytes per 256).
    Q6K,
}

const GGML_TYPE_NAMES: [&str; 40] = [
    "F32",
    "F16",
    "Q4_0",
    "Q4_1",
    "Q4_2",
    "Q4_3",
    "Q5_0",
    "Q5_1",
    "Q8_0",
    "Q8_1",
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
    "Q8_K",
    "IQ2_XXS",
    "IQ2_XS",
    "IQ3_XXS",
    "IQ1_S",
    "IQ4_NL",
    "IQ3_S",
    "IQ2_S",
    "IQ4_XS",
    "I8",
    "I16",
    "I32",
    "I64",
    "F64",
    "IQ1_M",
    "BF16",
    "Q4_0_4_4",
    "Q4_0_4_8",
    "Q4_0_8_8",
    "TQ1_0",
    "TQ2_0",
    "IQ4_NL_4_4",
    "IQ4_NL_4_8",
    "IQ4_NL_8_8",
    "MXFP4",
];

impl TensorType {
    fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            12 => Self::Q4K,
            13 => Self::Q5K,
            14 => Self::Q6K,
            30 => Self::Bf16,
            _ => return None,
        })
    }

    /// ggml's name for the type.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::Bf16 => "BF16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q4K => "Q4_K",
            Self::Q5K => "Q5_K",
            Self::Q6K => "Q6_K",
        }
    }

    /// Elements per block and bytes per block.
    pub fn block(self) -> (usize, usize) {
        match self {
            Self::F32 => (1, 4),
            Self::F16 | Self::Bf16 => (1, 2),
            Self::Q4_0 => (32, 18),
            Self::Q4_1 => (32, 20),
            Self::Q5_0 => (32, 22),
            Self::Q5_1 => (32, 24),
            Self::Q8_0 => (32, 34),
            Self::Q4K => (256, 144),
            Self::Q5K => (256, 176),
            Self::Q6K => (256, 210),
        }
    }

    /// Bytes of a row of `n` elements (`n` must be a multiple of the block size).
    pub fn row_bytes(self, n: usize) -> usize {
        let (elems, bytes) = self.block();
        n / elems * bytes
    }
}

/// One tensor's directory entry.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    /// Tensor name.
    pub name: String,
    /// Dimensions in GGUF order: `dims[0]` is the row length (innermost).
    pub dims: Vec<usize>,
    /// Element type.
    pub dtype: TensorType,
    /// Byte offset of the data from the start of the file.
    pub offset: usize,
    /// Byte length of the data.
    pub len: usize,
}

impl TensorInfo {
    /// Number of elements.
    pub fn elements(&self) -> usize {
        self.dims.iter().product()
    }
}

/// An open GGUF file: metadata, tensor directory and the mapped bytes.
pub struct Gguf {
    /// GGUF version (2 or 3).
    pub version: u32,
    /// Metadata, sorted by key.
    pub metadata: BTreeMap<String, Value>,
    /// Tensors by name.
    pub tensors: BTreeMap<String, TensorInfo>,
    /// The whole file, mapped.
    mmap: Mmap,
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], GgufError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len());
        match end {
            Some(end) => {
                let s = &self.bytes[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(GgufError::Truncated {
                what: what.to_string(),
                start: self.pos as u64,
                end: self.pos as u64 + n as u64,
                len: self.bytes.len() as u64,
            }),
        }
    }
    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().unwrap()))
    }
    fn len(&mut self, what: &str) -> Result<usize, GgufError> {
        let n = self.u64(what)?;
        // No count can exceed the bytes left in the file (every element takes at least one byte).
        if n > (self.bytes.len() - self.pos) as u64 {
            return Err(GgufError::Corrupt(format!(
                "{what} claims {n} elements at offset {}, more than the file holds",
                self.pos
            )));
        }
        Ok(n as usize)
    }
    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let n = self.len(what)?;
        Ok(String::from_utf8_lossy(self.take(n, what)?).into_owned())
    }
    fn value(&mut self, type_id: u32, what: &str, depth: u32) -> Result<Value, GgufError> {
        Ok(match type_id {
            0 => Value::Int(i64::from(self.take(1, what)?[0])),
            1 => Value::Int(i64::from(self.take(1, what)?[0] as i8)),
            2 => Value::Int(i64::from(u16::from_le_bytes(
                self.take(2, what)?.try_into().unwrap(),
            ))),
            3 => Value::Int(i64::from(i16::from_le_bytes(
                self.take(2, what)?.try_into().unwrap(),
            ))),
            4 => Value::Int(i64::from(self.u32(what)?)),
            5 => Value::Int(i64::from(self.u32(what)? as i32)),
            6 => Value::Float(f64::from(f32::from_le_bytes(
                self.take(4, what)?.try_into().unwrap(),
            ))),
            7 => Value::Bool(self.take(1, what)?[0] != 0),
            8 => Value::Str(self.string(what)?),
            9 => {
                if depth > 2 {
                    return Err(GgufError::Corrupt(format!(
                        "{what}: arrays nested too deeply"
                    )));
                }
                let elem_type = self.u32(what)?;
                let n = self.len(what)?;
                let mut items = Vec::with_capacity(n.min(1 << 20));
                for _ in 0..n {
                    items.push(self.value(elem_type, what, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => {
                let v = self.u64(what)?;
                i64::try_from(v).map(Value::Int).unwrap_or(Value::UInt(v))
            }
            11 => Value::Int(self.u64(what)? as i64),
            12 => Value::Float(f64::from_le_bytes(self.take(8, what)?.try_into().unwrap())),
            t => {
                return Err(GgufError::Corrupt(format!(
                    "{what}: unknown value type {t}"
                )))
            }
        })
    }
}

impl Gguf {
    /// Opens and validates a GGUF file.
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the mapping is read-only; kvq never writes model files while it runs.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::parse(mmap, path)
    }

    fn parse(mmap: Mmap, path: &Path) -> Result<Self, GgufError> {
        let bytes: &[u8] = &mmap;
        if bytes.len() < 4 || &bytes[..4] != b"GGUF" {
            return Err(GgufError::NotGguf {
                path: path.to_path_buf(),
                magic: bytes[..bytes.len().min(4)].to_vec(),
            });
        }
        let mut r = Reader { bytes, pos: 4 };
        let version = r.u32("header")?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::UnsupportedVersion(version));
        }
        let n_tensors = r.len("tensor count")?;
        let n_kv = r.len("metadata count")?;
        let mut metadata = BTreeMap::new();
        for i in 0..n_kv {
            let key = r.string(&format!("metadata key #{i}"))?;
            let type_id = r.u32(&key)?;
            let value = r.value(type_id, &key, 0)?;
            metadata.insert(key, value);
        }
        let alignment = match metadata.get("general.alignment") {
            None => 32,
            Some(Value::Int(a)) if *a > 0 && (*a as u64).is_power_of_two() => *a as usize,
            Some(v) => {
                return Err(GgufError::Corrupt(format!("general.alignment is {v:?}")));
            }
        };
        let mut infos = Vec::with_capacity(n_tensors.min(1 << 16));
        for i in 0..n_tensors {
            let name = r.string(&format!("tensor name #{i}"))?;
            let n_dims = r.u32(&name)? as usize;
            if n_dims == 0 || n_dims > 4 {
                return Err(GgufError::Corrupt(format!(
                    "tensor {name} has {n_dims} dimensions"
                )));
            }
            let mut dims = Vec::with_capacity(n_dims);
            for _ in 0..n_dims {
                dims.push(r.u64(&name)? as usize);
            }
            let type_id = r.u32(&name)?;
            let offset = r.u64(&name)? as usize;
            infos.push((name, dims, type_id, offset));
        }
        let data_start = r.pos.div_ceil(alignment) * alignment;
        let mut tensors = BTreeMap::new();
        for (name, dims, type_id, offset) in infos {
            let dtype =
                TensorType::from_id(type_id).ok_or_else(|| GgufError::UnsupportedTensorType {
                    tensor: name.clone(),
                    type_id,
                    type_name: GGML_TYPE_NAMES
                        .get(type_id as usize)
                        .unwrap_or(&"unknown")
                        .to_string(),
                })?;
            let elements = dims
                .iter()
                .try_fold(1usize, |acc, &d| acc.checked_mul(d))
                .ok_or_else(|| {
                    GgufError::Corrupt(format!("tensor {name} dims {dims:?} overflow"))
                })?;
            let (block_elems, block_bytes) = dtype.block();
            if dims[0] % block_elems != 0 {
                return Err(GgufError::Corrupt(format!(
                    "tensor {name}: row length {} is not a multiple of {}'s block of {block_elems}",
                    dims[0],
                    dtype.name()
                )));
            }
            let len = elements / block_elems * block_bytes;
            let start = data_start
                .checked_add(offset)
                .filter(|s| s % alignment == 0);
            let Some(start) = start else {
                return Err(GgufError::Corrupt(format!(
                    "tensor {name}: misaligned offset {offset}"
                )));
            };
            let end = start as u64 + len as u64;
            if end > bytes.len() as u64 {
                return Err(GgufError::Truncated {
                    what: format!("data of tensor {name}"),
                    start: start as u64,
                    end,
                    len: bytes.len() as u64,
                });
            }
            if tensors.contains_key(&name) {
                return Err(GgufError::Corrupt(format!("tensor {name} appears twice")));
            }
            tensors.insert(
                name.clone(),
                TensorInfo {
                    name,
                    dims,
                    dtype,
                    offset: start,
                    len,
                },
            );
        }
        Ok(Self {
            version,
            metadata,
            tensors,
            mmap,
        })
    }

    /// The raw bytes of a tensor.
    pub fn tensor_bytes(&self, info: &TensorInfo) -> &[u8] {
        &self.mmap[info.offset..info.offset + info.len]
    }

    /// Looks up a tensor by name.
    pub fn tensor(&self, name: &str) -> Result<&TensorInfo, GgufError> {
        self.tensors.get(name).ok_or_else(|| GgufError::Tensor {
            name: name.to_string(),
            problem: "missing from the GGUF file".into(),
        })
    }

    /// A metadata value, or an error naming the missing key.
    pub fn get(&self, key: &str) -> Result<&Value, GgufError> {
        self.metadata.get(key).ok_or_else(|| GgufError::Metadata {
            key: key.to_string(),
            problem: "missing".into(),
        })
    }

    /// A string metadata value.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        match self.get(key)? {
            Value::Str(s) => Ok(s),
            v => Err(type_error(key, "string", v)),
        }
    }

    /// An integer metadata value that must fit in `usize`.
    pub fn get_usize(&self, key: &str) -> Result<usize, GgufError> {
        match self.get(key)? {
            Value::Int(i) if *i >= 0 => Ok(*i as usize),
            v => Err(type_error(key, "non-negative integer", v)),
        }
    }

    /// A float metadata value (integers are accepted).
    pub fn get_f64(&self, key: &str) -> Result<f64, GgufError> {
        match self.get(key)? {
            Value::Float(f) => Ok(*f),
            Value::Int(i) => Ok(*i as f64),
            v => Err(type_error(key, "number", v)),
        }
    }

    /// An array metadata value.
    pub fn get_array(&self, key: &str) -> Result<&[Value], GgufError> {
        match self.get(key)? {
            Value::Array(a) => Ok(a),
            v => Err(type_error(key, "array", v)),
        }
    }

    /// Counts tensors per element type.
    pub fn type_histogram(&self) -> BTreeMap<TensorType, usize> {
        let mut h = BTreeMap::new();
        for t in self.tensors.values() {
            *h.entry(t.dtype).or_insert(0) += 1;
        }
        h
    }
}

fn type_error(key: &str, want: &str, got: &Value) -> GgufError {
    GgufError::Metadata {
        key: key.to_string(),
        problem: format!("expected a {want}, found a {}", got.type_name()),
    }
}

/// A tensor to write with [`write_gguf`].
pub struct TensorData {
    /// Tensor name.
    pub name: String,
    /// Dimensions in GGUF order (`dims[0]` is the row length).
    pub dims: Vec<usize>,
    /// Element type.
    pub dtype: TensorType,
    /// Raw bytes in that type's layout.
    pub bytes: Vec<u8>,
}

fn ggml_type_id(t: TensorType) -> u32 {
    match t {
        TensorType::F32 => 0,
        TensorType::F16 => 1,
        TensorType::Q4_0 => 2,
        TensorType::Q4_1 => 3,
        TensorType::Q5_0 => 6,
        TensorType::Q5_1 => 7,
        TensorType::Q8_0 => 8,
        TensorType::Q4K => 12,
        TensorType::Q5K => 13,
        TensorType::Q6K => 14,
        TensorType::Bf16 => 30,
    }
}

fn write_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn write_value(out: &mut Vec<u8>, v: &Value) {
    let (type_id, body): (u32, Vec<u8>) = match v {
        Value::Int(i) => (11, i.to_le_bytes().to_vec()),
        Value::UInt(u) => (10, u.to_le_bytes().to_vec()),
        Value::Float(f) => (12, f.to_le_bytes().to_vec()),
        Value::Bool(b) => (7, vec![u8::from(*b)]),
        Value::Str(s) => {
            let mut b = Vec::new();
            write_string(&mut b, s);
            (8, b)
        }
        Value::Array(items) => {
            let mut b = Vec::new();
            let elem = items.first().map_or(Value::Int(0), Clone::clone);
            let mut first = Vec::new();
            write_value(&mut first, &elem);
            b.extend_from_slice(&first[..4]);
            b.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                let mut one = Vec::new();
                write_value(&mut one, item);
                b.extend_from_slice(&one[4..]);
            }
            (9, b)
        }
    };
    out.extend_from_slice(&type_id.to_le_bytes());
    out.extend_from_slice(&body);
}

/// Serializes a GGUF v3 file (alignment 32). Used to build small models for tests and tools;
/// arrays must hold values of one type.
pub fn write_gguf(metadata: &BTreeMap<String, Value>, tensors: &[TensorData]) -> Vec<u8> {
    const ALIGN: usize = 32;
    let mut out = b"GGUF".to_vec();
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (k, v) in metadata {
        write_string(&mut out, k);
        write_value(&mut out, v);
    }
    let mut offset = 0usize;
    for t in tensors {
        write_string(&mut out, &t.name);
        out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for &d in &t.dims {
            out.extend_from_slice(&(d as u64).to_le_bytes());
        }
        out.extend_from_slice(&ggml_type_id(t.dtype).to_le_bytes());
        out.extend_from_slice(&(offset as u64).to_le_bytes());
        offset = (offset + t.bytes.len()).div_ceil(ALIGN) * ALIGN;
    }
    out.resize(out.len().div_ceil(ALIGN) * ALIGN, 0);
    for t in tensors {
        out.extend_from_slice(&t.bytes);
        out.resize(out.len().div_ceil(ALIGN) * ALIGN, 0);
    }
    out
}
