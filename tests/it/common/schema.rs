//! Validation of JSON values against the protocol's JSON Schemas in
//! `schemas/json` (draft 2020-12), for the root package's integration tests.
//!
//! ```ignore
//! use crate::common::schema::assert_valid;
//! assert_valid("methods/message.send.result.schema.json", &result);
//! assert_valid("DeliveryStatus.schema.json", &status);
//! ```
//!
//! Every schema file is registered under its `$id` in an in-memory registry so
//! relative `$ref`s resolve offline, and compiled once.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use jsonschema::{Draft, Registry, Validator};
use serde_json::Value;

const BASE: &str = "https://relay.invalid/schemas/";

/// `schemas/json` of the workspace.
pub fn schema_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas").join("json")
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("reading schemas/json").path();
        if path.is_dir() {
            collect(&path, out);
        } else if path.to_string_lossy().ends_with(".schema.json") {
            out.push(path);
        }
    }
}

/// Every schema file keyed by its path relative to `schemas/json` ("/"-separated).
fn load() -> BTreeMap<String, Value> {
    let root = schema_dir();
    let mut paths = Vec::new();
    collect(&root, &mut paths);
    paths
        .into_iter()
        .map(|path| {
            let rel = path
                .strip_prefix(&root)
                .expect("path under schemas/json")
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/");
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let doc = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: not JSON: {e}", path.display()));
            (rel, doc)
        })
        .collect()
}

fn validators() -> &'static BTreeMap<String, Validator> {
    static VALIDATORS: OnceLock<BTreeMap<String, Validator>> = OnceLock::new();
    VALIDATORS.get_or_init(|| {
        let docs = load();
        let registry = Registry::new()
            .draft(Draft::Draft202012)
            .extend(docs.iter().map(|(rel, doc)| (format!("{BASE}{rel}"), doc.clone())))
            .expect("registering schemas")
            .prepare()
            .expect("preparing the schema registry");
        docs.iter()
            .map(|(rel, doc)| {
                let validator = jsonschema::options()
                    .with_draft(Draft::Draft202012)
                    .with_registry(&registry)
                    .build(doc)
                    .unwrap_or_else(|e| panic!("schema {rel} does not compile: {e}"));
                (rel.clone(), validator)
            })
            .collect()
    })
}

fn validator(schema: &str) -> &'static Validator {
    validators().get(schema).unwrap_or_else(|| {
        let known: Vec<&String> = validators().keys().collect();
        panic!("no schema {schema:?} under schemas/json; known: {known:?}")
    })
}

/// The validation errors of `instance` against `schema` (a file name relative
/// to `schemas/json`, e.g. "DeliveryStatus.schema.json"); empty when valid.
pub fn validation_errors(schema: &str, instance: &Value) -> Vec<String> {
    validator(schema)
        .iter_errors(instance)
        .map(|e| format!("{} (at \"{}\", schema \"{}\")", e, e.instance_path(), e.schema_path()))
        .collect()
}

/// Panics with the validation errors and the instance unless `instance` is
/// valid against `schema`, e.g. "methods/message.send.result.schema.json".
#[track_caller]
pub fn assert_valid(schema: &str, instance: &Value) {
    let errors = validation_errors(schema, instance);
    if !errors.is_empty() {
        panic!(
            "instance does not match {schema}:\n  {}\ninstance: {}",
            errors.join("\n  "),
            serde_json::to_string_pretty(instance).unwrap_or_else(|_| instance.to_string())
        );
    }
}

/// `assert_valid` against `methods/{method}.result.schema.json`.
#[track_caller]
pub fn assert_valid_result(method: &str, result: &Value) {
    assert_valid(&format!("methods/{method}.result.schema.json"), result);
}

/// `assert_valid` against `methods/{method}.params.schema.json`.
#[track_caller]
pub fn assert_valid_params(method: &str, params: &Value) {
    assert_valid(&format!("methods/{method}.params.schema.json"), params);
}
