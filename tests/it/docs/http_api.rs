//! `docs/src/http-api.md` names every endpoint and every error code of the
//! OpenAPI document the relay serves.

use serde_json::Value;

const CHAPTER: &str = "docs/src/http-api.md";

fn document() -> Value {
    serde_json::from_str(eventrelay::http::ops::OPENAPI).unwrap()
}

#[test]
fn every_endpoint_of_the_openapi_document_is_in_the_chapter() {
    let chapter = super::read(CHAPTER);
    let document = document();
    let mut missing = Vec::new();
    let mut endpoints = 0;
    for (path, operations) in document["paths"].as_object().unwrap() {
        for method in operations.as_object().unwrap().keys() {
            if !["get", "post", "put", "patch", "delete"].contains(&method.as_str()) {
                continue;
            }
            endpoints += 1;
            let endpoint = format!("`{} {path}`", method.to_uppercase());
            if !chapter.contains(&endpoint) {
                missing.push(endpoint);
            }
        }
    }
    assert!(
        endpoints >= 10,
        "the OpenAPI document lists only {endpoints} endpoints"
    );
    assert!(
        missing.is_empty(),
        "{CHAPTER} does not describe {missing:?}"
    );
}

#[test]
fn every_error_code_is_in_the_chapter() {
    let chapter = super::read(CHAPTER);
    let document = document();
    let codes = document["components"]["schemas"]["Error"]["properties"]["error"]["properties"]
        ["code"]["enum"]
        .as_array()
        .unwrap();
    assert!(!codes.is_empty());
    let missing: Vec<&str> = codes
        .iter()
        .map(|code| code.as_str().unwrap())
        .filter(|code| !chapter.contains(&format!("`{code}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "{CHAPTER} does not name the error codes {missing:?}"
    );
}
