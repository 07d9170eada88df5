//! The spec's verdict on a request is the server's: every value the spec calls valid is accepted (never a 400),
//! every value it calls invalid is refused (a 4xx). Each case sends one value of a constrained parameter, body or
//! form field to the real binary; the verdict comes from validating that value against the spec's own schema,
//! so a pattern, a length, a `required`, a `nullable` or a type that the server reads differently fails here.

use reqwest::{Method, Url};
use serde_json::{Value, json};

use kiln_tests::contract::RequestSchemas;

use crate::binary::{start, temp_dir};

/// Where the value under test goes.
enum Input {
    /// One path parameter: its name, and the path with it in place of `{name}`.
    Path(&'static str, String),
    /// One query parameter: its name, the text sent, and the value the spec sees (a number for an integer).
    Query(&'static str, String, Value),
    /// A JSON body, as sent; text that is not JSON is invalid whatever the schema.
    Json(String),
    /// A multipart form: its text fields, with an `image` file part.
    Form(Vec<(&'static str, String)>),
    /// No body at all, to this path.
    NoBody(&'static str),
}

struct Case {
    method: Method,
    /// The operation's path as the spec writes it.
    template: &'static str,
    input: Input,
}

fn case(method: Method, template: &'static str, input: Input) -> Case {
    Case { method, template, input }
}

fn operation<'s>(spec: &'s Value, case: &Case) -> &'s Value {
    &spec["paths"][case.template][case.method.as_str().to_lowercase().as_str()]
}

fn parameter_schema<'s>(operation: &'s Value, name: &str) -> &'s Value {
    operation["parameters"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == name))
        .map(|p| &p["schema"])
        .unwrap_or_else(|| panic!("no parameter {name}"))
}

/// The spec's verdict: `Ok` when it calls the value valid, `Err(why)` otherwise.
fn verdict(schemas: &RequestSchemas, spec: &Value, case: &Case) -> Result<(), String> {
    let operation = operation(spec, case);
    match &case.input {
        Input::Path(name, path) => {
            let placeholder = format!("{{{name}}}");
            let value = case
                .template
                .split('/')
                .zip(path.split('/'))
                .find_map(|(t, v)| (t == placeholder).then_some(v))
                .unwrap_or_else(|| panic!("{path} has no {placeholder}"));
            // A path parameter is text on the wire: an integer parameter sees a number when it parses as one.
            let value = value.parse::<i64>().map_or(json!(value), |n| json!(n));
            schemas.validate(parameter_schema(operation, name), &value)
        }
        Input::NoBody(_) => match operation["requestBody"]["required"].as_bool() {
            Some(true) => Err("the body is required".to_owned()),
            _ => Ok(()),
        },
        Input::Query(name, _, seen) => schemas.validate(parameter_schema(operation, name), seen),
        Input::Json(text) => {
            let body: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
            schemas
                .validate(&operation["requestBody"]["content"]["application/json"]["schema"], &body)
        }
        Input::Form(fields) => {
            let media = &operation["requestBody"]["content"]["multipart/form-data"];
            let mut form = serde_json::Map::new();
            form.insert("image".to_owned(), json!("bytes"));
            for (name, text) in fields {
                let json_field = media["encoding"][name]["contentType"] == "application/json";
                let value = if json_field {
                    serde_json::from_str(text).map_err(|e| format!("{name} is not JSON: {e}"))?
                } else {
                    json!(text)
                };
                form.insert((*name).to_owned(), value);
            }
            schemas.validate(&media["schema"], &Value::Object(form))
        }
    }
}

/// A path segment with every byte but the unreserved ones percent-encoded.
fn escape(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

const PNG: &[u8] = include_bytes!("../../../tests/browser/kiln-input.png");

fn prompt(extra: Value) -> String {
    let mut body = json!({"prompt": {
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0}},
        "2": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}},
    }});
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    body.to_string()
}

fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    let ids = [
        "00000000-0000-4000-8000-000000000000",
        "0",
        "ABCDEF00-0000-4000-8000-000000000000",
        "00000000000040008000000000000000",
        "{00000000-0000-4000-8000-000000000000}",
        "00000000-0000-4000-8000-00000000000g",
        "00000000-0000-4000-8000-000000000000\n",
    ];
    for id in ids {
        cases.push(case(
            Method::GET,
            "/api/jobs/{job_id}",
            Input::Path("job_id", format!("/api/jobs/{id}")),
        ));
        cases.push(case(
            Method::POST,
            "/api/jobs/{job_id}/cancel",
            Input::Path("job_id", format!("/api/jobs/{id}/cancel")),
        ));
        cases.push(case(
            Method::POST,
            "/api/jobs/cancel",
            Input::Json(json!({"job_ids": [id]}).to_string()),
        ));
    }
    let names = [
        "a.png",
        "",
        "/etc/passwd",
        "a/../b.png",
        "..",
        "x.png [input]",
        " [input]",
        " [temp]",
        "...",
        "a..b",
        " [input]\n",
        "\n..",
        "a [b",
    ];
    for name in names {
        let input = Input::Query("filename", name.to_owned(), json!(name));
        cases.push(case(Method::GET, "/api/view", input));
    }
    for dir in ["a", "", "/", "//", "a/", "./"] {
        cases.push(case(
            Method::GET,
            "/api/userdata",
            Input::Query("dir", dir.to_owned(), json!(dir)),
        ));
    }
    let users =
        ["kiln", "", " ", "\t\n", "\u{3000}", " padded ", "\u{85}", "\u{1c}", "\u{feff}", "\u{a0}"];
    for name in users {
        cases.push(case(
            Method::POST,
            "/api/users",
            Input::Json(json!({"username": name}).to_string()),
        ));
    }
    for items in ["-1", "0", "-9223372036854775808", "9223372036854775807", "1.5", "x"] {
        let seen = items.parse::<i64>().map_or(json!(items), |n| json!(n));
        cases.push(case(
            Method::GET,
            "/api/history",
            Input::Query("max_items", items.to_owned(), seen),
        ));
    }
    for index in ["0", "7", "-1", "x"] {
        let path = format!("/api/experiment/models/preview/loras/{index}/a.safetensors");
        let input = Input::Path("path_index", path);
        cases.push(case(
            Method::GET,
            "/api/experiment/models/preview/{folder}/{path_index}/{filename}",
            input,
        ));
    }
    let prompts = [
        prompt(json!({})),
        json!({}).to_string(),
        json!({"prompt": {}}).to_string(),
        json!([]).to_string(),
        prompt(json!({"prompt_id": "ABCDEF00-0000-4000-8000-000000000000"})),
        prompt(json!({"prompt_id": "00000000-0000-4000-8000-0000000000aa"})),
        prompt(json!({"prompt_id": null, "client_id": null, "number": null, "front": null,
                      "extra_data": null, "partial_execution_targets": null})),
        prompt(json!({"partial_execution_targets": []})),
        prompt(json!({"partial_execution_targets": ["2"]})),
        prompt(
            json!({"extra_data": {"client_id": null, "extra_pnginfo": null, "comfy_usage_source": null,
                                     "preview_method": null, "create_time": null}}),
        ),
        json!({"prompt": {"1": {"class_type": "EmptyImage", "inputs": {}, "_meta": ["a title"]}}})
            .to_string(),
    ];
    for body in prompts {
        cases.push(case(Method::POST, "/api/prompt", Input::Json(body)));
    }
    let bodies: [(&str, &[&str]); 5] = [
        ("/api/free", &[r#"{"free_memory": null}"#, "[true]", r#"{"free_memory": "yes"}"#]),
        ("/api/queue", &[r#"{"clear": null}"#, r#"{"delete": null}"#, "[]"]),
        ("/api/history", &[r#"{"clear": null}"#, r#"{"clear": 1}"#]),
        (
            "/api/interrupt",
            &["{}", r#"{"prompt_id": null}"#, r#"{"prompt_id": 5}"#, "[]", "not json"],
        ),
        ("/api/settings", &["{}", "null", "[]"]),
    ];
    for (template, bodies) in bodies {
        for body in bodies {
            cases.push(case(Method::POST, template, Input::Json((*body).to_owned())));
        }
    }
    let subfolders = ["", "a", "a/b/", "/", "/a", "..", "a/..", "a/../b", "...", "..a", "./a"];
    for subfolder in subfolders {
        let input = Input::Form(vec![("subfolder", subfolder.to_owned())]);
        cases.push(case(Method::POST, "/api/upload/image", input));
    }
    for kind in ["input", "output", "temp", "", "elsewhere"] {
        cases.push(case(
            Method::POST,
            "/api/upload/image",
            Input::Form(vec![("type", kind.to_owned())]),
        ));
    }
    let originals = [
        r#"{"filename": "none.png"}"#,
        r#"{"filename": ""}"#,
        r#"{"filename": "a.png", "type": "elsewhere"}"#,
        r#"{"filename": "a.png", "subfolder": "../.."}"#,
        r#"{"subfolder": "a"}"#,
        r#"["a.png"]"#,
        "not json",
    ];
    for original in originals {
        let input = Input::Form(vec![("original_ref", original.to_owned())]);
        cases.push(case(Method::POST, "/api/upload/mask", input));
    }
    // No body writes an empty file, as ComfyUI (HTTP cannot tell no body from an empty one).
    let input = Input::NoBody("/api/userdata/empty.txt");
    cases.push(case(Method::POST, "/api/userdata/{file}", input));
    cases
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_spec_and_the_server_agree_on_what_is_valid() {
    let data_dir = temp_dir("spec-agreement");
    let (_server, addr) = start(&data_dir);
    let http = reqwest::Client::new();
    let spec: Value = serde_yaml::from_str(kiln_spec::OPENAPI_YAML).expect("the spec parses");
    let schemas = RequestSchemas::from_spec();
    let base = Url::parse(&format!("http://{addr}")).expect("base URL");
    let mut disagreements = Vec::new();
    let cases = cases();
    for case in &cases {
        let spec_says = verdict(&schemas, &spec, case);
        let request = match &case.input {
            Input::Path(_, path) => {
                // Every byte of a segment but the unreserved ones is escaped (the URL parser would drop a raw
                // newline rather than send it).
                let encoded: Vec<String> = path.split('/').map(escape).collect();
                http.request(case.method.clone(), format!("{base}{}", &encoded.join("/")[1..]))
            }
            Input::Query(name, text, _) => {
                let mut url = base.join(case.template).expect("URL");
                url.query_pairs_mut().append_pair(name, text);
                http.request(case.method.clone(), url)
            }
            Input::Json(body) => http
                .request(case.method.clone(), base.join(case.template).expect("URL"))
                .body(body.clone()),
            Input::Form(fields) => {
                let mut form = reqwest::multipart::Form::new();
                for (name, value) in fields {
                    form = form.text(*name, value.clone());
                }
                let image = reqwest::multipart::Part::bytes(PNG).file_name("agreement.png");
                http.request(case.method.clone(), base.join(case.template).expect("URL"))
                    .multipart(form.part("image", image))
            }
            Input::NoBody(path) => http.request(case.method.clone(), base.join(path).expect("URL")),
        };
        let response = request.send().await.expect("answers");
        let status = response.status().as_u16();
        let body = response.text().await.unwrap_or_default();
        let agrees = match &spec_says {
            Ok(()) => status != 400,
            Err(_) => (400..500).contains(&status),
        };
        if !agrees {
            let input = match &case.input {
                Input::Path(_, path) => path.clone(),
                Input::Query(name, text, _) => format!("?{name}={text:?}"),
                Input::Json(body) => body.clone(),
                Input::Form(fields) => format!("{fields:?}"),
                Input::NoBody(path) => format!("{path} (no body)"),
            };
            disagreements.push(format!(
                "{} {} {input}: the spec says {spec_says:?}, the server answered {status} {body}",
                case.method, case.template
            ));
        }
    }
    assert!(cases.len() > 100, "{} cases", cases.len());
    assert!(
        disagreements.is_empty(),
        "{} disagreement(s):\n{}",
        disagreements.len(),
        disagreements.join("\n")
    );
    let _ = std::fs::remove_dir_all(&data_dir);
}
