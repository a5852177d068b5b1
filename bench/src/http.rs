//! A minimal HTTP/1.1 keep-alive client: blocking over `std::net::TcpStream`
//! for setup, and asynchronous over tokio's for the measured window (one
//! thread drives every connection, as `wrk` does). The bench should measure
//! the relay, not a client library or its own threads.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `http://host:port[/...]` → `host:port`.
pub fn host_port(url: &str) -> Result<String, String> {
    let rest = url.strip_prefix("http://").ok_or_else(|| format!("{url}: only http:// URLs are supported"))?;
    let hp = rest.split('/').next().unwrap_or(rest);
    if hp.is_empty() {
        return Err(format!("{url}: no host"));
    }
    Ok(if hp.contains(':') { hp.to_string() } else { format!("{hp}:80") })
}

/// The bytes of a `POST /v1/rpc/{method}` request, built once.
pub fn rpc_request(method: &str, token: Option<&str>, body: &[u8]) -> Vec<u8> {
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let mut req = format!(
        "POST /v1/rpc/{method} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    req
}

/// A whole reply found at the start of the bytes received: its status, its
/// body and how many bytes it took.
#[derive(Debug, PartialEq)]
struct Reply {
    status: u16,
    body: Vec<u8>,
    used: usize,
}

/// The reply at the start of `buf`, or `None` while it is incomplete.
fn parse_reply(buf: &[u8]) -> Result<Option<Reply>, String> {
    let mut fields = [httparse::EMPTY_HEADER; 32];
    let mut head = httparse::Response::new(&mut fields);
    let start = match head.parse(buf).map_err(|e| format!("bad reply head: {e}"))? {
        httparse::Status::Complete(start) => start,
        httparse::Status::Partial => return Ok(None),
    };
    let status = head.code.ok_or("reply without a status")?;
    let (mut len, mut chunked) = (0, false);
    for field in head.headers.iter() {
        if field.name.eq_ignore_ascii_case("content-length") {
            len = std::str::from_utf8(field.value)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .ok_or_else(|| "bad content-length".to_string())?;
        } else if field.name.eq_ignore_ascii_case("transfer-encoding")
            && String::from_utf8_lossy(field.value).to_ascii_lowercase().contains("chunked")
        {
            chunked = true;
        }
    }
    if !chunked {
        return Ok(buf.get(start..start + len).map(|b| Reply { status, body: b.to_vec(), used: start + len }));
    }
    // Chunks up to the last (size 0), no trailers.
    let (mut at, mut body) = (start, Vec::new());
    loop {
        let (size_len, n) = match httparse::parse_chunk_size(&buf[at..]).map_err(|_| "bad chunk size".to_string())? {
            httparse::Status::Complete(sized) => sized,
            httparse::Status::Partial => return Ok(None),
        };
        let n = usize::try_from(n).map_err(|_| "bad chunk size".to_string())?;
        let data = at + size_len;
        let Some(chunk) = buf.get(data..data + n + 2) else {
            return Ok(None);
        };
        at = data + n + 2;
        if n == 0 {
            return Ok(Some(Reply { status, body, used: at }));
        }
        body.extend_from_slice(&chunk[..n]);
    }
}

/// Bytes received and not yet taken by a reply.
#[derive(Default)]
struct Received(Vec<u8>);

impl Received {
    /// The next reply if it is all here, removing its bytes.
    fn take(&mut self) -> Result<Option<(u16, Vec<u8>)>, String> {
        let Some(r) = parse_reply(&self.0)? else {
            return Ok(None);
        };
        self.0.drain(..r.used);
        Ok(Some((r.status, r.body)))
    }
}

const READ_CHUNK: usize = 64 * 1024;
/// How long a connect or a reply may take before it counts as an error.
const TIMEOUT: Duration = Duration::from_secs(60);

pub struct Conn {
    addr: String,
    stream: TcpStream,
    received: Received,
}

impl Conn {
    pub fn open(addr: &str) -> Result<Conn, String> {
        let s = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
        let _ = s.set_nodelay(true);
        let _ = s.set_read_timeout(Some(TIMEOUT));
        Ok(Conn { addr: addr.to_string(), stream: s, received: Received::default() })
    }

    /// Sends a pre-built request and reads the reply: (status, body).
    pub fn roundtrip(&mut self, request: &[u8]) -> Result<(u16, Vec<u8>), String> {
        self.stream.write_all(request).map_err(|e| format!("{}: write: {e}", self.addr))?;
        let mut chunk = vec![0; READ_CHUNK];
        loop {
            if let Some(reply) = self.received.take()? {
                return Ok(reply);
            }
            match self.stream.read(&mut chunk).map_err(|e| format!("{}: read: {e}", self.addr))? {
                0 => return Err(format!("{}: connection closed", self.addr)),
                n => self.received.0.extend_from_slice(&chunk[..n]),
            }
        }
    }

    pub fn get(&mut self, path: &str) -> Result<(u16, Vec<u8>), String> {
        let req = format!("GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n");
        self.roundtrip(req.as_bytes())
    }

    /// A setup call that must succeed: the JSON reply.
    pub fn ok(
        &mut self,
        method: &str,
        token: Option<&str>,
        params: &serde_json::Value,
    ) -> Result<serde_json::Value, String> {
        let body = serde_json::to_vec(params).map_err(|e| e.to_string())?;
        let (status, reply) = self.roundtrip(&rpc_request(method, token, &body))?;
        if status != 200 {
            return Err(format!("{method}: HTTP {status}: {}", String::from_utf8_lossy(&reply)));
        }
        serde_json::from_slice(&reply).map_err(|e| format!("{method}: {e}"))
    }
}

/// The measured window's connection: the same protocol on tokio's socket.
pub struct AsyncConn {
    addr: String,
    stream: tokio::net::TcpStream,
    received: Received,
}

impl AsyncConn {
    pub async fn open(addr: &str) -> Result<AsyncConn, String> {
        let connect = tokio::net::TcpStream::connect(addr);
        let s = tokio::time::timeout(TIMEOUT, connect).await.map_err(|_| format!("connect {addr}: timed out"))?;
        let s = s.map_err(|e| format!("connect {addr}: {e}"))?;
        let _ = s.set_nodelay(true);
        Ok(AsyncConn { addr: addr.to_string(), stream: s, received: Received::default() })
    }

    /// Sends a pre-built request and reads the reply, within `TIMEOUT` (as
    /// the blocking client's read timeout): a relay that stops answering
    /// gives errors, not a bench that never ends.
    pub async fn roundtrip(&mut self, request: &[u8]) -> Result<(u16, Vec<u8>), String> {
        let addr = self.addr.clone();
        tokio::time::timeout(TIMEOUT, self.exchange(request))
            .await
            .map_err(|_| format!("{addr}: no reply in {TIMEOUT:?}"))?
    }

    async fn exchange(&mut self, request: &[u8]) -> Result<(u16, Vec<u8>), String> {
        self.stream.write_all(request).await.map_err(|e| format!("{}: write: {e}", self.addr))?;
        loop {
            if let Some(reply) = self.received.take()? {
                return Ok(reply);
            }
            self.received.0.reserve(READ_CHUNK);
            match self.stream.read_buf(&mut self.received.0).await.map_err(|e| format!("{}: read: {e}", self.addr))? {
                0 => return Err(format!("{}: connection closed", self.addr)),
                _ => continue,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_is_taken_only_when_all_of_it_has_arrived() {
        let reply = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nx: y\r\n\r\nhello";
        for cut in 0..reply.len() {
            assert_eq!(parse_reply(&reply[..cut]).unwrap(), None, "cut at {cut}");
        }
        // The next reply's first bytes are left for it.
        let r = parse_reply(&[&reply[..], b"HTTP/1.1 404"].concat()).unwrap().unwrap();
        assert_eq!((r.status, r.body.as_slice(), r.used), (200, &b"hello"[..], reply.len()));
    }

    #[test]
    fn a_chunked_reply_is_joined_up_to_its_last_chunk() {
        let whole = b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n";
        assert_eq!(parse_reply(&whole[..whole.len() - 1]).unwrap(), None);
        let r = parse_reply(whole).unwrap().unwrap();
        assert_eq!((r.status, r.body.as_slice(), r.used), (201, &b"abcde"[..], whole.len()));
    }

    #[test]
    fn a_bad_status_line_is_an_error() {
        assert!(parse_reply(b"garbage\r\n\r\n").is_err());
        assert!(parse_reply(b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n").is_err());
    }
}
