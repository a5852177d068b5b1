//! The web client (`web/`), embedded in the binary and served at `/`, and
//! CORS for the client API.
//!
//! The bundle is built by `npm run build` in `web/` and committed, so
//! `relay serve` needs nothing else installed; CI rebuilds it and fails when
//! it differs from the committed one.

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{self, HeaderValue};
use actix_web::http::Method;
use actix_web::middleware::Next;
use actix_web::{web, HttpResponse};
use relay_schemas::RelayError;

const INDEX: &str = include_str!("../../../web/src/index.html");
const APP: &str = include_str!("../../../web/dist/app.js");
/// The service worker (Web Push: shows "New message"; PROTOCOL §9).
const SERVICE_WORKER: &str = include_str!("../../../web/dist/sw.js");
/// The QR decoder, loaded by the page only to scan with a camera in a
/// browser without a BarcodeDetector: kept out of `app.js` to keep it small.
const SCANNER: &str = include_str!("../../../web/dist/scan.js");

/// What the page needs to know about the relay that served it.
#[derive(Clone, Debug)]
pub struct ClientInfo {
    pub relay_id: String,
    pub public_url: String,
}

async fn index() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        // The page loads only its own script and talks only to its relay:
        // contacts on other relays are reached through it.
        .insert_header((
            header::CONTENT_SECURITY_POLICY,
            "default-src 'self'; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'",
        ))
        .body(INDEX)
}

async fn app() -> HttpResponse {
    HttpResponse::Ok().content_type("text/javascript; charset=utf-8").body(APP)
}

async fn scanner() -> HttpResponse {
    HttpResponse::Ok().content_type("text/javascript; charset=utf-8").body(SCANNER)
}

async fn service_worker() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/javascript; charset=utf-8")
        // Browsers look for a new worker on every navigation when told so.
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .body(SERVICE_WORKER)
}

/// Browsers ask for `/favicon.ico` whatever the page says. The client has
/// no icon: "nothing here", cached for a day, instead of a 404 on every visit.
async fn favicon() -> HttpResponse {
    HttpResponse::NoContent().insert_header((header::CACHE_CONTROL, "max-age=86400")).finish()
}

async fn client_json(info: web::Data<ClientInfo>) -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({"relay_id": info.relay_id, "public_url": info.public_url}))
}

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/", web::get().to(index))
        .route("/index.html", web::get().to(index))
        .route("/app.js", web::get().to(app))
        .route("/scan.js", web::get().to(scanner))
        .route("/sw.js", web::get().to(service_worker))
        .route("/favicon.ico", web::get().to(favicon))
        .route("/client.json", web::get().to(client_json));
}

/// The origins allowed to call the client API from a browser: the relay's
/// own (where its web client is served) and `http.cors_origins`.
#[derive(Clone, Debug)]
pub struct Cors {
    origins: Vec<String>,
    any: bool,
}

impl Cors {
    pub fn new(public_url: &str, extra: &[String]) -> Cors {
        let mut origins: Vec<String> = extra.iter().map(|o| o.trim_end_matches('/').to_owned()).collect();
        origins.push(origin_of(public_url));
        Cors { any: origins.iter().any(|o| o == "*"), origins }
    }

    fn allows(&self, origin: &str) -> bool {
        self.any || self.origins.iter().any(|o| o == origin)
    }
}

/// `scheme://host[:port]` of a URL.
fn origin_of(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("http", url));
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    format!("{scheme}://{host}")
}

/// Answers `OPTIONS` preflights and adds `Access-Control-Allow-Origin` to
/// responses for allowed origins. Requests without `Origin` (and same-origin
/// GETs) pass untouched; a disallowed origin gets no CORS headers, so the
/// browser refuses the answer, and its preflight is `forbidden`.
pub async fn cors(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let origin = req.headers().get(header::ORIGIN).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let allowed = match (&origin, req.app_data::<web::Data<Cors>>()) {
        (Some(o), Some(cors)) => cors.allows(o),
        _ => false,
    };
    if req.method() == Method::OPTIONS && origin.is_some() {
        let resp = if allowed {
            HttpResponse::NoContent()
                .insert_header((header::ACCESS_CONTROL_ALLOW_METHODS, "GET, POST, OPTIONS"))
                .insert_header((header::ACCESS_CONTROL_ALLOW_HEADERS, "authorization, content-type"))
                .insert_header((header::ACCESS_CONTROL_MAX_AGE, "600"))
                .finish()
        } else {
            super::reply::error_response(&RelayError::forbidden("origin not in http.cors_origins"))
        };
        return Ok(with_cors(req.into_response(resp), origin.as_deref().filter(|_| allowed)));
    }
    let resp = next.call(req).await?.map_into_boxed_body();
    Ok(with_cors(resp, origin.as_deref().filter(|_| allowed)))
}

fn with_cors(mut resp: ServiceResponse<BoxBody>, origin: Option<&str>) -> ServiceResponse<BoxBody> {
    let headers = resp.headers_mut();
    vary_origin(headers);
    if let Some(value) = origin.and_then(|o| HeaderValue::from_str(o).ok()) {
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
    }
    resp
}

/// What [`cors`] adds to every answer, with or without an `Origin`.
pub(crate) fn vary_origin(headers: &mut actix_web::http::header::HeaderMap) {
    headers.append(header::VARY, HeaderValue::from_static("Origin"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_own_origin_is_always_allowed() {
        let cors = Cors::new("http://127.0.0.1:7801/", &[]);
        assert!(cors.allows("http://127.0.0.1:7801"));
        assert!(!cors.allows("http://127.0.0.1:7802"));
        let cors = Cors::new("https://a.example/relay", &["https://app.example/".into()]);
        assert!(cors.allows("https://a.example") && cors.allows("https://app.example"));
        assert!(!cors.allows("https://evil.example"));
        assert!(Cors::new("http://x", &["*".into()]).allows("https://any.example"));
    }
}
