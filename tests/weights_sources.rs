//! Weights without a local checkpoint file: the hub download path (against a local HTTP server
//! that speaks the few headers hf-hub needs), the offline message, seeded random weights, and
//! `.pt` files holding bf16/fp16 and non-contiguous tensors.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;

use streamrecon::model::ModelConfig;
use streamrecon::model::weights::WeightStore;
use streamrecon::model::weights::hub::{HubRequest, download};
use streamrecon::model::weights::random::random_store;

fn fixture(name: &str) -> Option<PathBuf> {
    common::gct_tiny_fixtures(name).map(|dir| dir.join(name))
}

/// Answer one request: `Range: bytes=a-b` or `bytes=a-` of `body`, with hub headers.
fn serve_one(mut stream: TcpStream, body: &[u8], path_expected: &str) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    let mut range = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        let lower = line.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("range: bytes=") {
            range = Some(v.trim().to_owned());
        }
    }
    let path = request_line.split_whitespace().nth(1).unwrap_or_default();
    if path != path_expected {
        reply(
            &mut stream,
            &[b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"],
        );
        return;
    }
    let (start, end) = match range.as_deref().and_then(|r| r.split_once('-')) {
        Some((a, b)) => {
            let a: usize = a.parse().unwrap_or(0);
            let b: usize = if b.is_empty() {
                body.len() - 1
            } else {
                b.parse().unwrap_or(0)
            };
            (a, b.min(body.len() - 1))
        }
        None => (0, body.len() - 1),
    };
    let chunk = &body[start..=end];
    let head = format!(
        "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {start}-{end}/{}\r\n\
         ETag: \"0123456789abcdef\"\r\nX-Repo-Commit: fedcba9876543210\r\nConnection: close\r\n\r\n",
        chunk.len(),
        body.len()
    );
    reply(&mut stream, &[head.as_bytes(), chunk]);
}

/// Writes a response. A client that hung up early makes the test fail on its side, with a
/// better message than the server could give.
fn reply(stream: &mut impl Write, parts: &[&[u8]]) {
    let sent = parts
        .iter()
        .try_for_each(|p| stream.write_all(p))
        .and_then(|()| stream.flush());
    if let Err(e) = sent {
        eprintln!("test server: the client went away: {e}");
    }
}

#[test]
fn hub_download_through_a_local_server() {
    let Some(file) = fixture("weights.safetensors") else {
        return;
    };
    let body = std::fs::read(&file).expect("fixture readable");
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let served = body.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            serve_one(
                stream,
                &served,
                "/test/tiny-model/resolve/main/weights.safetensors",
            );
        }
    });
    let cache = tempfile::tempdir().expect("tempdir");
    let endpoint = format!("http://{addr}");
    let req = HubRequest {
        endpoint: Some(&endpoint),
        cache_dir: Some(cache.path()),
        repo: "test/tiny-model",
        file: "weights.safetensors",
    };
    let path = download(&req).expect("download succeeds");
    assert!(
        path.starts_with(cache.path()),
        "{} lands in the HF cache",
        path.display()
    );
    let mut got = Vec::new();
    std::fs::File::open(&path)
        .expect("downloaded")
        .read_to_end(&mut got)
        .expect("read");
    assert_eq!(got.len(), body.len());
    assert!(got == body);
    let store = WeightStore::load(&path).expect("downloaded file loads");
    assert_eq!(store.len(), 358);
    // Second call finds the cached file without the server.
    let again = download(&HubRequest {
        endpoint: Some("http://127.0.0.1:9"),
        ..req
    })
    .expect("cached");
    assert_eq!(again, path);
}

#[test]
fn offline_download_is_a_clear_message() {
    // Nothing listens on the discard port; the error must tell the user what to do.
    let cache = tempfile::tempdir().expect("tempdir");
    let err = download(&HubRequest {
        endpoint: Some("http://127.0.0.1:9"),
        cache_dir: Some(cache.path()),
        repo: "robbyant/lingbot-map",
        file: "lingbot-map-long.pt",
    })
    .expect_err("offline");
    let msg = err.to_string();
    assert!(
        msg.contains("offline") && msg.contains("--weights"),
        "{msg}"
    );
    assert!(msg.contains("lingbot-map-long.pt"), "{msg}");
}

#[test]
fn random_weights_are_seeded_and_complete() {
    let cfg = ModelConfig::tiny();
    let mut a = random_store(&cfg, 7).expect("random weights");
    let mut b = random_store(&cfg, 7).expect("random weights");
    let mut c = random_store(&cfg, 8).expect("random weights");
    assert_eq!(a.len(), cfg.parameter_shapes().len());
    let name = "aggregator.frame_blocks.0.attn.qkv.weight";
    let read = |s: &mut streamrecon::model::weights::WeightStore| s.read(name).expect("read");
    assert_eq!(read(&mut a), read(&mut b));
    assert_ne!(read(&mut a), read(&mut c));
    // The model builds from it with nothing missing or left over.
    streamrecon::model::GctModel::from_store(cfg, a).expect("random tiny model builds");
}

/// Pickle (protocol 2) of `{"model": {"w": tensor}}` or `{"w": tensor}` with a tensor of
/// `storage_class` elements, shape (2, 3), stride (1, 2): a transposed view of a 3×2 storage.
fn tiny_pickle(storage_class: &str, wrapped: bool) -> Vec<u8> {
    let mut p = vec![0x80, 2];
    let unicode = |p: &mut Vec<u8>, s: &str| {
        p.push(b'X');
        p.extend((s.len() as u32).to_le_bytes());
        p.extend(s.as_bytes());
    };
    p.push(b'}');
    if wrapped {
        unicode(&mut p, "model");
        p.push(b'}');
    }
    unicode(&mut p, "w");
    p.extend(b"ctorch._utils\n_rebuild_tensor_v2\n");
    p.push(b'(');
    p.push(b'(');
    unicode(&mut p, "storage");
    p.extend(format!("ctorch\n{storage_class}\n").as_bytes());
    unicode(&mut p, "0");
    unicode(&mut p, "cpu");
    p.extend([b'K', 6]);
    p.push(b't');
    p.push(b'Q');
    p.extend([b'K', 0]); // offset
    p.extend([b'K', 2, b'K', 3, 0x86]); // size (2, 3)
    p.extend([b'K', 1, b'K', 2, 0x86]); // stride (1, 2)
    p.push(0x89); // requires_grad False
    p.extend(b"ccollections\nOrderedDict\n");
    p.push(b')');
    p.push(b'R');
    p.push(b't');
    p.push(b'R');
    p.push(b's');
    if wrapped {
        p.push(b's');
    }
    p.push(b'.');
    p
}

fn write_pt(dir: &std::path::Path, name: &str, pickle: &[u8], storage: &[u8]) -> PathBuf {
    let path = dir.join(name);
    let file = std::fs::File::create(&path).expect("create");
    let mut zip = zip::ZipWriter::new(file);
    let opts =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (entry, bytes) in [
        ("archive/data.pkl", pickle),
        ("archive/byteorder", b"little".as_slice()),
        ("archive/data/0", storage),
    ] {
        zip.start_file(entry, opts).expect("entry");
        zip.write_all(bytes).expect("write");
    }
    zip.finish().expect("finish");
    path
}

#[test]
fn pt_half_precision_and_strided_tensors() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Storage values 0..6; the (2,3) view with stride (1,2) reads [[0,2,4],[1,3,5]].
    let values = [0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0];
    let want = vec![0.0f32, 2.0, 4.0, 1.0, 3.0, 5.0];
    let bf16: Vec<u8> = values
        .iter()
        .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
        .collect();
    let f16: Vec<u8> = values
        .iter()
        .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
        .collect();
    let f32b: Vec<u8> = values.iter().flat_map(|&v| v.to_le_bytes()).collect();
    for (class, bytes, wrapped) in [
        ("BFloat16Storage", &bf16, true),
        ("HalfStorage", &f16, false),
        ("FloatStorage", &f32b, true),
    ] {
        let path = write_pt(
            dir.path(),
            &format!("{class}.pt"),
            &tiny_pickle(class, wrapped),
            bytes,
        );
        let mut store = WeightStore::load(&path).unwrap_or_else(|e| panic!("{class}: {e}"));
        let t = store.read("w").expect("tensor w");
        assert_eq!(t.shape, vec![2, 3], "{class}");
        assert_eq!(t.data, want, "{class}");
    }
    // A storage shorter than the view reaches: an error naming the tensor.
    let path = write_pt(
        dir.path(),
        "short.pt",
        &tiny_pickle("FloatStorage", true),
        &f32b[..12],
    );
    let err = WeightStore::load(&path).expect_err("short storage");
    assert!(err.to_string().contains("`w`"), "{err}");
    // An unsupported storage type is named.
    let path = write_pt(
        dir.path(),
        "int.pt",
        &tiny_pickle("LongStorage", true),
        &f32b,
    );
    let err = WeightStore::load(&path).expect_err("int storage");
    assert!(err.to_string().contains("LongStorage"), "{err}");
}
