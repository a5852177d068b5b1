//! A minimal blocking HTTP/1.1 keep-alive client over `std::net::TcpStream`:
//! the bench should measure the relay, not a client library.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

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

pub struct Conn {
    addr: String,
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    line: String,
}

impl Conn {
    pub fn open(addr: &str) -> Result<Conn, String> {
        let s = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
        let _ = s.set_nodelay(true);
        let _ = s.set_read_timeout(Some(Duration::from_secs(60)));
        let r = s.try_clone().map_err(|e| e.to_string())?;
        Ok(Conn { addr: addr.to_string(), reader: BufReader::new(r), writer: s, line: String::new() })
    }

    /// Sends a pre-built request and reads the reply: (status, body).
    pub fn roundtrip(&mut self, request: &[u8]) -> Result<(u16, Vec<u8>), String> {
        self.writer.write_all(request).map_err(|e| format!("{}: write: {e}", self.addr))?;
        self.read_reply()
    }

    pub fn get(&mut self, path: &str) -> Result<(u16, Vec<u8>), String> {
        let req = format!("GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n");
        self.roundtrip(req.as_bytes())
    }

    fn read_reply(&mut self) -> Result<(u16, Vec<u8>), String> {
        let err = |e: std::io::Error| e.to_string();
        self.line.clear();
        if self.reader.read_line(&mut self.line).map_err(err)? == 0 {
            return Err(format!("{}: connection closed", self.addr));
        }
        let status: u16 = self
            .line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("bad status line {:?}", self.line))?;
        let mut len = 0;
        let mut chunked = false;
        loop {
            self.line.clear();
            if self.reader.read_line(&mut self.line).map_err(err)? == 0 {
                return Err("connection closed in headers".into());
            }
            if self.line == "\r\n" {
                break;
            }
            let l = self.line.to_ascii_lowercase();
            if let Some(v) = l.strip_prefix("content-length:") {
                len = v.trim().parse().map_err(|_| "bad content-length".to_string())?;
            } else if l.starts_with("transfer-encoding:") && l.contains("chunked") {
                chunked = true;
            }
        }
        if !chunked {
            let mut body = vec![0; len];
            self.reader.read_exact(&mut body).map_err(err)?;
            return Ok((status, body));
        }
        let mut body = Vec::new();
        loop {
            self.line.clear();
            self.reader.read_line(&mut self.line).map_err(err)?;
            let n = usize::from_str_radix(self.line.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| "bad chunk size".to_string())?;
            let mut chunk = vec![0; n + 2];
            self.reader.read_exact(&mut chunk).map_err(err)?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
        Ok((status, body))
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
