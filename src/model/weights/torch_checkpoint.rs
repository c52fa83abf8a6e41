//! PyTorch `.pt` checkpoints (the zip format of `torch.save`), read without Python: the zip
//! archive holds `<root>/data.pkl` (the pickled object) and one record `<root>/data/<key>` per
//! storage. The object is either `{"model": state_dict}` or a bare state dict.

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::Path;

use super::pickle::{self, TensorRef, Value};
use super::{RawTensor, decode_elements};
use crate::model::error::{ModelError, Result};

/// Read every tensor of a `.pt` checkpoint, converted to f32.
pub fn read_torch_checkpoint(path: &Path) -> Result<Vec<RawTensor>> {
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
    let entries = state_dict_entries(object)
        .ok_or_else(|| ModelError::bad_file(path, "data.pkl holds no state dict"))?;

    // Tensors may share a storage record; each record is read once and dropped after its last
    // tensor, so peak memory stays near the f32 result rather than twice the checkpoint.
    let mut uses: HashMap<String, usize> = HashMap::new();
    for (_, t) in &entries {
        *uses.entry(t.storage_key.clone()).or_default() += 1;
    }
    let mut storages: HashMap<String, Vec<u8>> = HashMap::new();
    let mut out = Vec::with_capacity(entries.len());
    for (name, tensor) in entries {
        if !storages.contains_key(&tensor.storage_key) {
            let record = format!("{root}data/{}", tensor.storage_key);
            let bytes =
                read_record(&mut archive, &record, path).map_err(|_| ModelError::BadTensor {
                    path: path.to_owned(),
                    name: name.clone(),
                    reason: format!("storage record `{record}` is missing or unreadable"),
                })?;
            storages.insert(tensor.storage_key.clone(), bytes);
        }
        let bytes = &storages[&tensor.storage_key];
        let data = gather_strided(bytes, &tensor).map_err(|reason| ModelError::BadTensor {
            path: path.to_owned(),
            name: name.clone(),
            reason,
        })?;
        if let Some(n) = uses.get_mut(&tensor.storage_key) {
            *n -= 1;
            if *n == 0 {
                storages.remove(&tensor.storage_key);
            }
        }
        out.push(RawTensor {
            name,
            shape: tensor.shape,
            data,
        });
    }
    Ok(out)
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

/// Copy a strided window of a storage into a contiguous f32 buffer.
fn gather_strided(bytes: &[u8], t: &TensorRef) -> std::result::Result<Vec<f32>, String> {
    let elem = t.dtype.size_bytes();
    let storage_len = bytes.len() / elem;
    let numel: usize = t.shape.iter().product();
    if numel == 0 {
        return Ok(Vec::new());
    }
    // Largest element index touched, checked against the storage size before any read.
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
