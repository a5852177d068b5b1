//! HTTP/1.1 on blocking sockets for the stand-ins on loopback (the fake
//! peer, the fault-injecting proxy, the push service): the head of a
//! request or response, and a whole message read from a socket, its body
//! by `Content-Length` or chunked (de-chunked).

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Where `needle` first occurs in `hay`.
pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The head of a request or response.
#[derive(Clone, Debug)]
pub struct Head {
    /// The request line or the status line.
    pub line: String,
    /// Names as sent; values trimmed.
    pub headers: Vec<(String, String)>,
}

impl Head {
    /// The first header named `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// The second word of the first line: a request's target (path).
    pub fn target(&self) -> &str {
        self.line.split(' ').nth(1).unwrap_or("")
    }

    /// A response's status code.
    pub fn status(&self) -> Option<u16> {
        self.target().parse().ok()
    }

    /// Whether the body is sent chunked.
    pub fn chunked(&self) -> bool {
        self.header("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
    }

    /// The `Content-Length` (0 when absent or unreadable).
    pub fn content_length(&self) -> usize {
        self.header("content-length").and_then(|v| v.parse().ok()).unwrap_or(0)
    }
}

/// Parses a complete head at the start of `buf` (`httparse`: a response
/// if it starts `HTTP/`, else a request): the head and where the body
/// starts; None until `buf` holds the blank line ending the head, or if
/// the head is not HTTP/1.x.
pub fn parse_head(buf: &[u8]) -> Option<(Head, usize)> {
    let mut fields = [httparse::EMPTY_HEADER; 64];
    let (status, fields) = if buf.starts_with(b"HTTP/") {
        let mut response = httparse::Response::new(&mut fields);
        (response.parse(buf).ok()?, response.headers)
    } else {
        let mut request = httparse::Request::new(&mut fields);
        (request.parse(buf).ok()?, request.headers)
    };
    let httparse::Status::Complete(start) = status else { return None };
    let line = String::from_utf8_lossy(&buf[..find(buf, b"\r\n")?]).into_owned();
    let headers =
        fields.iter().map(|f| (f.name.to_string(), String::from_utf8_lossy(f.value).trim().to_string())).collect();
    Some((Head { line, headers }, start))
}

/// Decodes a chunked body at the start of `buf` (no trailers): the body and
/// the bytes used; None while incomplete or unreadable.
pub fn dechunk(buf: &[u8]) -> Option<(Vec<u8>, usize)> {
    let mut body = Vec::new();
    let mut at = 0;
    loop {
        let httparse::Status::Complete((size_len, size)) = httparse::parse_chunk_size(&buf[at..]).ok()? else {
            return None;
        };
        let (data, size) = (at + size_len, usize::try_from(size).ok()?);
        body.extend_from_slice(buf.get(data..data + size)?);
        buf.get(data + size..data + size + 2)?;
        at = data + size + 2;
        if size == 0 {
            return Some((body, at));
        }
    }
}

/// One HTTP/1.1 message read whole.
#[derive(Clone, Debug)]
pub struct Message {
    pub head: Head,
    /// The body, de-chunked if it was sent chunked.
    pub body: Vec<u8>,
}

/// Reads more bytes into `buf`; None at the end of the stream or on an error
/// (a read timeout included).
pub fn read_more(s: &mut impl Read, buf: &mut Vec<u8>) -> Option<()> {
    let mut chunk = [0u8; 8192];
    let n = s.read(&mut chunk).ok()?;
    if n == 0 {
        return None;
    }
    buf.extend_from_slice(&chunk[..n]);
    Some(())
}

/// Reads one request or response from `s`: the head, then a chunked body or
/// `Content-Length` bytes (none without). None if the stream ends or fails
/// first.
pub fn read_message(s: &mut impl Read) -> Option<Message> {
    let mut buf = Vec::new();
    let (head, start) = loop {
        if let Some(parsed) = parse_head(&buf) {
            break parsed;
        }
        read_more(s, &mut buf)?;
    };
    let mut rest = buf.split_off(start);
    let body = if head.chunked() {
        loop {
            if let Some((body, _)) = dechunk(&rest) {
                break body;
            }
            read_more(s, &mut rest)?;
        }
    } else {
        let len = head.content_length();
        while rest.len() < len {
            read_more(s, &mut rest)?;
        }
        rest.truncate(len);
        rest
    };
    Some(Message { head, body })
}

/// Serves every connection `listener` accepts on a thread of its own, until
/// `stop` is set (seen at the next accept: the owner connects once after
/// setting it).
pub fn serve_each(listener: TcpListener, stop: Arc<AtomicBool>, serve: impl Fn(TcpStream) + Send + Sync + 'static) {
    let serve = Arc::new(serve);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            let Ok(conn) = conn else { continue };
            let serve = serve.clone();
            std::thread::spawn(move || serve(conn));
        }
    });
}
