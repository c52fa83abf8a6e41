//! A minimal pickle virtual machine: just enough of the protocol that `torch.save` writes for a
//! state dict (protocols 2 to 5). It builds a small value tree; tensors come out as
//! [`TensorRef`]s that point into the checkpoint's storage records. Anything it does not
//! understand becomes an opaque value, and an opcode it does not know is a clear error rather
//! than a guess.

use std::collections::HashMap;

/// Element type of a torch storage record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StorageDtype {
    F32,
    F16,
    BF16,
    F64,
}

impl StorageDtype {
    fn from_class_name(name: &str) -> Option<Self> {
        match name {
            "FloatStorage" => Some(StorageDtype::F32),
            "HalfStorage" => Some(StorageDtype::F16),
            "BFloat16Storage" => Some(StorageDtype::BF16),
            "DoubleStorage" => Some(StorageDtype::F64),
            _ => None,
        }
    }

    pub fn size_bytes(self) -> usize {
        match self {
            StorageDtype::F32 => 4,
            StorageDtype::F16 | StorageDtype::BF16 => 2,
            StorageDtype::F64 => 8,
        }
    }
}

/// A tensor as `torch._utils._rebuild_tensor_v2` describes it: a window into a storage record.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorRef {
    pub storage_key: String,
    pub dtype: StorageDtype,
    /// Offset into the storage, in elements.
    pub offset: usize,
    pub shape: Vec<usize>,
    /// Strides in elements.
    pub stride: Vec<usize>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    Tuple(Vec<Value>),
    List(Vec<Value>),
    Dict(Vec<(Value, Value)>),
    Global {
        module: String,
        name: String,
    },
    Storage {
        key: String,
        dtype: Option<StorageDtype>,
        class: String,
    },
    Tensor(TensorRef),
    /// A call this VM does not model (kept only so the stream can continue).
    Opaque(String),
}

impl Value {
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
    fn as_usize(&self) -> Option<usize> {
        match self {
            Value::Int(i) if *i >= 0 => usize::try_from(*i).ok(),
            _ => None,
        }
    }
    fn as_usize_list(&self) -> Option<Vec<usize>> {
        match self {
            Value::Tuple(items) | Value::List(items) => items
                .iter()
                .map(Value::as_usize)
                .collect::<Option<Vec<_>>>(),
            _ => None,
        }
    }
}

/// Why a pickle stream could not be evaluated.
#[derive(Debug, Clone, PartialEq)]
pub struct PickleError(pub String);

type PResult<T> = std::result::Result<T, PickleError>;

fn perr<T>(msg: impl Into<String>) -> PResult<T> {
    Err(PickleError(msg.into()))
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> PResult<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len());
        match end {
            Some(end) => {
                let s = &self.bytes[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => perr(format!("pickle stream ends early at byte {}", self.pos)),
        }
    }
    fn u8(&mut self) -> PResult<u8> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> PResult<u16> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> PResult<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn i32(&mut self) -> PResult<i32> {
        Ok(self.u32()? as i32)
    }
    fn u64(&mut self) -> PResult<u64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    fn line(&mut self) -> PResult<String> {
        let rest = &self.bytes[self.pos..];
        match rest.iter().position(|&b| b == b'\n') {
            Some(n) => {
                let s = String::from_utf8_lossy(&rest[..n]).into_owned();
                self.pos += n + 1;
                Ok(s)
            }
            None => perr("pickle stream ends inside a text line"),
        }
    }
    fn utf8(&mut self, n: usize) -> PResult<String> {
        let b = self.take(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| PickleError("invalid UTF-8 string".into()))
    }
}

fn checked_len(n: u64) -> PResult<usize> {
    usize::try_from(n).map_err(|_| PickleError("length does not fit in memory".into()))
}

/// Evaluate a pickle stream and return the object it builds.
pub fn evaluate(bytes: &[u8]) -> PResult<Value> {
    let mut r = Reader { bytes, pos: 0 };
    let mut stack: Vec<Value> = Vec::new();
    let mut marks: Vec<usize> = Vec::new();
    let mut memo: HashMap<u64, Value> = HashMap::new();

    fn pop(stack: &mut Vec<Value>) -> PResult<Value> {
        stack
            .pop()
            .ok_or_else(|| PickleError("pickle stack underflow".into()))
    }
    fn pop_mark(stack: &mut Vec<Value>, marks: &mut Vec<usize>) -> PResult<Vec<Value>> {
        let m = marks
            .pop()
            .ok_or_else(|| PickleError("pickle MARK missing".into()))?;
        if m > stack.len() {
            return perr("pickle MARK beyond stack");
        }
        Ok(stack.split_off(m))
    }
    fn top_mut(stack: &mut [Value]) -> PResult<&mut Value> {
        stack
            .last_mut()
            .ok_or_else(|| PickleError("pickle stack underflow".into()))
    }
    fn set_items(target: &mut Value, items: Vec<Value>) -> PResult<()> {
        if !items.len().is_multiple_of(2) {
            return perr("odd number of items for a dict");
        }
        match target {
            Value::Dict(entries) => {
                let mut it = items.into_iter();
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    entries.push((k, v));
                }
                Ok(())
            }
            // Items set on objects we do not model are dropped.
            Value::Opaque(_) => Ok(()),
            _ => perr("SETITEM(S) on something that is not a dict"),
        }
    }

    loop {
        let op = r.u8()?;
        match op {
            0x80 => {
                r.u8()?; // PROTO
            }
            0x95 => {
                r.u64()?; // FRAME (protocol 4+): only a read-ahead hint
            }
            b'.' => return pop(&mut stack), // STOP
            b'(' => marks.push(stack.len()),
            b'}' => stack.push(Value::Dict(Vec::new())),
            b']' => stack.push(Value::List(Vec::new())),
            b')' => stack.push(Value::Tuple(Vec::new())),
            b'N' => stack.push(Value::None),
            0x88 => stack.push(Value::Bool(true)),
            0x89 => stack.push(Value::Bool(false)),
            b'K' => {
                let v = r.u8()?;
                stack.push(Value::Int(v as i64))
            }
            b'M' => {
                let v = r.u16()?;
                stack.push(Value::Int(v as i64))
            }
            b'J' => {
                let v = r.i32()?;
                stack.push(Value::Int(v as i64))
            }
            0x8a => {
                // LONG1: little-endian two's complement of n bytes
                let n = r.u8()? as usize;
                let b = r.take(n)?;
                if n > 8 {
                    return perr("integer too large");
                }
                let mut v: i64 = 0;
                for (i, byte) in b.iter().enumerate() {
                    v |= (*byte as i64) << (8 * i);
                }
                if n > 0 && n < 8 && b[n - 1] & 0x80 != 0 {
                    v -= 1i64 << (8 * n);
                }
                stack.push(Value::Int(v))
            }
            b'G' => {
                let b = r.take(8)?;
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                stack.push(Value::Float(f64::from_be_bytes(a)))
            }
            b'X' => {
                let n = r.u32()? as usize;
                let s = r.utf8(n)?;
                stack.push(Value::Str(s))
            }
            0x8c => {
                let n = r.u8()? as usize;
                let s = r.utf8(n)?;
                stack.push(Value::Str(s))
            }
            0x8d => {
                let n = checked_len(r.u64()?)?;
                let s = r.utf8(n)?;
                stack.push(Value::Str(s))
            }
            b'B' => {
                let n = r.u32()? as usize;
                stack.push(Value::Bytes(r.take(n)?.to_vec()))
            }
            b'C' => {
                let n = r.u8()? as usize;
                stack.push(Value::Bytes(r.take(n)?.to_vec()))
            }
            b'c' => {
                let module = r.line()?;
                let name = r.line()?;
                stack.push(Value::Global { module, name })
            }
            0x93 => {
                // STACK_GLOBAL
                let name = pop(&mut stack)?;
                let module = pop(&mut stack)?;
                match (module, name) {
                    (Value::Str(module), Value::Str(name)) => {
                        stack.push(Value::Global { module, name })
                    }
                    _ => return perr("STACK_GLOBAL needs two strings"),
                }
            }
            b'q' => {
                let i = r.u8()? as u64;
                let v = top_mut(&mut stack)?.clone();
                memo.insert(i, v);
            }
            b'r' => {
                let i = r.u32()? as u64;
                let v = top_mut(&mut stack)?.clone();
                memo.insert(i, v);
            }
            0x94 => {
                // MEMOIZE
                let i = memo.len() as u64;
                let v = top_mut(&mut stack)?.clone();
                memo.insert(i, v);
            }
            b'h' => {
                let i = r.u8()? as u64;
                let v = memo
                    .get(&i)
                    .cloned()
                    .ok_or_else(|| PickleError(format!("memo {i} missing")))?;
                stack.push(v)
            }
            b'j' => {
                let i = r.u32()? as u64;
                let v = memo
                    .get(&i)
                    .cloned()
                    .ok_or_else(|| PickleError(format!("memo {i} missing")))?;
                stack.push(v)
            }
            b't' => {
                let items = pop_mark(&mut stack, &mut marks)?;
                stack.push(Value::Tuple(items))
            }
            0x85 => {
                let a = pop(&mut stack)?;
                stack.push(Value::Tuple(vec![a]))
            }
            0x86 => {
                let b = pop(&mut stack)?;
                let a = pop(&mut stack)?;
                stack.push(Value::Tuple(vec![a, b]))
            }
            0x87 => {
                let c = pop(&mut stack)?;
                let b = pop(&mut stack)?;
                let a = pop(&mut stack)?;
                stack.push(Value::Tuple(vec![a, b, c]))
            }
            b'l' => {
                let items = pop_mark(&mut stack, &mut marks)?;
                stack.push(Value::List(items))
            }
            b'd' => {
                let items = pop_mark(&mut stack, &mut marks)?;
                let mut d = Value::Dict(Vec::new());
                set_items(&mut d, items)?;
                stack.push(d)
            }
            b'a' => {
                let v = pop(&mut stack)?;
                match top_mut(&mut stack)? {
                    Value::List(items) => items.push(v),
                    _ => return perr("APPEND on something that is not a list"),
                }
            }
            b'e' => {
                let items = pop_mark(&mut stack, &mut marks)?;
                match top_mut(&mut stack)? {
                    Value::List(list) => list.extend(items),
                    _ => return perr("APPENDS on something that is not a list"),
                }
            }
            b's' => {
                let v = pop(&mut stack)?;
                let k = pop(&mut stack)?;
                set_items(top_mut(&mut stack)?, vec![k, v])?;
            }
            b'u' => {
                let items = pop_mark(&mut stack, &mut marks)?;
                set_items(top_mut(&mut stack)?, items)?;
            }
            b'0' => {
                pop(&mut stack)?;
            }
            b'1' => {
                pop_mark(&mut stack, &mut marks)?;
            }
            b'2' => {
                let v = top_mut(&mut stack)?.clone();
                stack.push(v)
            }
            b'Q' => {
                let pid = pop(&mut stack)?;
                stack.push(persistent_load(pid)?)
            }
            b'R' => {
                let args = pop(&mut stack)?;
                let callable = pop(&mut stack)?;
                stack.push(reduce(callable, args)?)
            }
            0x81 => {
                // NEWOBJ: cls.__new__(cls, *args)
                let args = pop(&mut stack)?;
                let cls = pop(&mut stack)?;
                stack.push(reduce(cls, args)?)
            }
            b'b' => {
                // BUILD: sets object state (e.g. an OrderedDict's `_metadata`); not needed.
                pop(&mut stack)?;
            }
            other => {
                return perr(format!(
                    "unsupported pickle opcode 0x{other:02x} at byte {}",
                    r.pos - 1
                ));
            }
        }
    }
}

/// `torch.save` writes storages as persistent ids:
/// `("storage", <class torch.FloatStorage>, key, location, numel)`.
fn persistent_load(pid: Value) -> PResult<Value> {
    let Value::Tuple(items) = pid else {
        return perr("persistent id is not a tuple");
    };
    if items.first().and_then(Value::as_str) != Some("storage") || items.len() < 3 {
        return perr("persistent id is not a storage record");
    }
    let class = match &items[1] {
        Value::Global { name, .. } => name.clone(),
        _ => return perr("storage record without a storage class"),
    };
    let key = match &items[2] {
        Value::Str(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        _ => return perr("storage record without a key"),
    };
    Ok(Value::Storage {
        key,
        dtype: StorageDtype::from_class_name(&class),
        class,
    })
}

fn reduce(callable: Value, args: Value) -> PResult<Value> {
    let Value::Global { module, name } = callable else {
        return Ok(Value::Opaque("call of a non-global".into()));
    };
    let args = match args {
        Value::Tuple(a) => a,
        _ => return perr(format!("{module}.{name}: arguments are not a tuple")),
    };
    match (module.as_str(), name.as_str()) {
        ("collections", "OrderedDict") | ("builtins", "dict") => Ok(Value::Dict(Vec::new())),
        ("torch._utils", "_rebuild_tensor_v2") | ("torch._utils", "_rebuild_tensor") => {
            rebuild_tensor(&args)
        }
        ("torch._utils", "_rebuild_parameter")
        | ("torch._utils", "_rebuild_parameter_with_state") => match args.into_iter().next() {
            Some(t @ Value::Tensor(_)) => Ok(t),
            _ => perr("_rebuild_parameter without a tensor"),
        },
        _ => Ok(Value::Opaque(format!("{module}.{name}"))),
    }
}

fn rebuild_tensor(args: &[Value]) -> PResult<Value> {
    if args.len() < 4 {
        return perr("_rebuild_tensor_v2 with too few arguments");
    }
    let (key, dtype, class) = match &args[0] {
        Value::Storage { key, dtype, class } => (key.clone(), *dtype, class.clone()),
        _ => return perr("_rebuild_tensor_v2 without a storage"),
    };
    let Some(dtype) = dtype else {
        return perr(format!(
            "storage type `{class}` is not supported (only float32, bfloat16, float16, float64)"
        ));
    };
    let offset = args[1]
        .as_usize()
        .ok_or_else(|| PickleError("bad storage offset".into()))?;
    let shape = args[2]
        .as_usize_list()
        .ok_or_else(|| PickleError("bad tensor size".into()))?;
    let stride = args[3]
        .as_usize_list()
        .ok_or_else(|| PickleError("bad tensor stride".into()))?;
    if shape.len() != stride.len() {
        return perr("tensor size and stride differ in length");
    }
    Ok(Value::Tensor(TensorRef {
        storage_key: key,
        dtype,
        offset,
        shape,
        stride,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evaluates_a_small_dict() {
        // {"a": (1, 2)} written with protocol 2 by hand.
        let bytes = b"\x80\x02}q\x00X\x01\x00\x00\x00aK\x01K\x02\x86s.";
        let v = evaluate(bytes).expect("valid pickle");
        assert_eq!(
            v,
            Value::Dict(vec![(
                Value::Str("a".into()),
                Value::Tuple(vec![Value::Int(1), Value::Int(2)])
            )])
        );
    }

    #[test]
    fn truncated_stream_is_an_error() {
        let bytes = b"\x80\x02}q\x00X\x01\x00\x00";
        assert!(evaluate(bytes).is_err());
    }

    #[test]
    fn unknown_opcode_is_an_error() {
        assert!(evaluate(b"\x80\x02\xff").is_err());
    }
}
