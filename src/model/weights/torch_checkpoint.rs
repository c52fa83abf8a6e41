//! PyTorch `.pt` checkpoints (the zip format of `torch.save`), read without Python: the zip
//! archive holds `<root>/data.pkl` (the pickled object) and one record `<root>/data/<key>` per
//! storage. The object is either `{"model": state_dict}` or a bare state dict.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use super::decode_elements;
use super::pickle::{self, TensorRef, Value};
use crate::model::error::{ModelError, Result};

/// The tensors of a `.pt` checkpoint, indexed from its pickle: each tensor's storage record is
/// read only when the model asks for that tensor, so the checkpoint is never in memory whole.
pub(crate) struct TorchIndex {
    pub archive: zip::ZipArchive<File>,
    /// Record name prefix (`<root>/data/`).
    pub data_prefix: String,
    pub tensors: Vec<(String, TensorRef)>,
}

pub(crate) fn index_torch_checkpoint(path: &Path) -> Result<TorchIndex> {
    let file = File::open(path).map_err(|e| ModelError::io(path, e))?;
    let mut archive = zip::ZipArchive::new(file)
        .map_err(|e| ModelError::bad_file(path, format!("not a PyTorch zip checkpoint ({e})")))?;
    let pickle_name = (0..archive.len())
        .filter_map(|i| archive.name_for_index(i).map(str::to_owned))
        .find(|n| n == "data.pkl" || n.ends_with("/data.pkl"))
        .ok_or_else(|| ModelError::bad_file(path, "zip archive has no data.pkl record"))?;
    let root = pickle_name.trim_end_matches("data.pkl").to_owned();

    let pickle_bytes = read_record(&mut archive, &pickle_name, path)?;
    if let Ok(order) = read_record(&mut archive, &format!("{root}byteorder"), path)
        && order.as_slice() != b"little"
    {
        return Err(ModelError::bad_file(
            path,
            "big-endian checkpoints are not supported",
        ));
    }
    let object = pickle::evaluate(&pickle_bytes)
        .map_err(|e| ModelError::bad_file(path, format!("data.pkl: {}", e.0)))?;
    let tensors = state_dict_entries(object)
        .ok_or_else(|| ModelError::bad_file(path, "data.pkl holds no state dict"))?;
    let data_prefix = format!("{root}data/");
    // Every record a tensor needs must exist and be long enough, checked now from the zip's
    // directory, so a damaged checkpoint fails at load and not halfway through the model.
    for (name, tensor) in &tensors {
        let record = format!("{data_prefix}{}", tensor.storage_key);
        let size = archive
            .by_name(&record)
            .map(|entry| entry.size())
            .map_err(|_| ModelError::BadTensor {
                path: path.to_owned(),
                name: name.clone(),
                reason: format!("storage record `{record}` is missing or unreadable"),
            })?;
        let elements = usize::try_from(size).unwrap_or(usize::MAX) / tensor.dtype.size_bytes();
        check_reach(elements, tensor).map_err(|reason| ModelError::BadTensor {
            path: path.to_owned(),
            name: name.clone(),
            reason,
        })?;
    }
    Ok(TorchIndex {
        archive,
        data_prefix,
        tensors,
    })
}

/// One tensor's values as f32: its storage record read, the tensor's window gathered.
pub(crate) fn read_tensor(
    archive: &mut zip::ZipArchive<File>,
    data_prefix: &str,
    tensor: &TensorRef,
    path: &Path,
) -> Result<Vec<f32>> {
    let record = format!("{data_prefix}{}", tensor.storage_key);
    let bytes = read_record(archive, &record, path)?;
    gather_strided(&bytes, tensor).map_err(|reason| ModelError::bad_file(path, reason))
}

fn read_record(archive: &mut zip::ZipArchive<File>, name: &str, path: &Path) -> Result<Vec<u8>> {
    let mut entry = archive
        .by_name(name)
        .map_err(|e| ModelError::bad_file(path, format!("record `{name}`: {e}")))?;
    let mut bytes = Vec::with_capacity(usize::try_from(entry.size()).unwrap_or(0));
    entry
        .read_to_end(&mut bytes)
        .map_err(|e| ModelError::bad_file(path, format!("record `{name}`: {e}")))?;
    Ok(bytes)
}

/// Unwrap `{"model": sd}` when present; an optional `module.` prefix (DataParallel) is stripped.
fn state_dict_entries(object: Value) -> Option<Vec<(String, TensorRef)>> {
    let Value::Dict(top) = object else {
        return None;
    };
    let model = top
        .iter()
        .find(|(k, v)| k.as_str() == Some("model") && matches!(v, Value::Dict(_)))
        .map(|(_, v)| v.clone());
    let dict = match model {
        Some(Value::Dict(d)) => d,
        _ => top,
    };
    let entries: Vec<(String, TensorRef)> = dict
        .into_iter()
        .filter_map(|(k, v)| match (k, v) {
            (Value::Str(name), Value::Tensor(t)) => {
                let name = name
                    .strip_prefix("module.")
                    .map(str::to_owned)
                    .unwrap_or(name);
                Some((name, t))
            }
            _ => None,
        })
        .collect();
    if entries.is_empty() {
        None
    } else {
        Some(entries)
    }
}

/// Whether a storage of `storage_len` elements holds every element the tensor reaches.
fn check_reach(storage_len: usize, t: &TensorRef) -> std::result::Result<(), String> {
    if t.shape.contains(&0) {
        return Ok(());
    }
    let mut last = t.offset;
    for (&n, &s) in t.shape.iter().zip(&t.stride) {
        last = (n - 1)
            .checked_mul(s)
            .and_then(|x| x.checked_add(last))
            .ok_or("stride overflow")?;
    }
    if last >= storage_len {
        return Err(format!(
            "storage holds {storage_len} elements but the tensor reaches element {last} (truncated file?)"
        ));
    }
    Ok(())
}

/// Copy a strided window of a storage into a contiguous f32 buffer.
fn gather_strided(bytes: &[u8], t: &TensorRef) -> std::result::Result<Vec<f32>, String> {
    let elem = t.dtype.size_bytes();
    let storage_len = bytes.len() / elem;
    let numel: usize = t.shape.iter().product();
    if numel == 0 {
        return Ok(Vec::new());
    }
    check_reach(storage_len, t)?;
    let contiguous = {
        let mut expect = 1usize;
        let mut ok = true;
        for (&n, &s) in t.shape.iter().zip(&t.stride).rev() {
            if n != 1 && s != expect {
                ok = false;
            }
            expect *= n;
        }
        ok
    };
    if contiguous {
        let start = t.offset * elem;
        return Ok(decode_elements(
            &bytes[start..start + numel * elem],
            t.dtype,
        ));
    }
    let all = decode_elements(&bytes[..storage_len * elem], t.dtype);
    let mut out = Vec::with_capacity(numel);
    let mut index = vec![0usize; t.shape.len()];
    for _ in 0..numel {
        let at = t.offset
            + index
                .iter()
                .zip(&t.stride)
                .map(|(i, s)| i * s)
                .sum::<usize>();
        out.push(all[at]);
        for d in (0..index.len()).rev() {
            index[d] += 1;
            if index[d] < t.shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
    Ok(out)
}
