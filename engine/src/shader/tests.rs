//! The interpreter against hand-computed values.

use super::*;

/// Renders `source` over `width` × `height` with one input image and the given uniforms.
fn render(source: &str, image: &Texture, uniforms: Vec<(String, Uniform)>) -> Vec<Rgba> {
    let shader = Shader::compile(source).unwrap_or_else(|e| panic!("{e}"));
    let (w, h) = image.size();
    let bindings =
        Bindings { textures: vec![("u_image0".to_owned(), image)], uniforms, unit0: image };
    shader.render(w, h, &bindings, 2, &|| false).unwrap_or_else(|e| panic!("{e}")).unwrap()
}

fn gradient(w: usize, h: usize) -> (Texture, Vec<f32>) {
    let pixels: Vec<f32> =
        (0..w * h).flat_map(|i| [i as f32 / 10.0, 0.5, 1.0 - i as f32 / 10.0]).collect();
    (Texture::from_image(w, h, 3, &pixels), pixels)
}

#[test]
fn the_default_shader_copies_its_image() {
    let (texture, pixels) = gradient(3, 2);
    let out = render(
        "#version 300 es\nprecision highp float;\nuniform sampler2D u_image0;\nin vec2 v_texCoord;\n\
         layout(location = 0) out vec4 fragColor0;\nvoid main() { fragColor0 = texture(u_image0, v_texCoord); }",
        &texture,
        Vec::new(),
    );
    assert_eq!(out.len(), 1);
    for (i, px) in out[0].iter().enumerate() {
        assert_eq!(px[..3], pixels[i * 3..i * 3 + 3], "pixel {i}");
        assert_eq!(px[3], 1.0);
    }
}

/// One image of the fixture: `[H, W, C]` floats.
fn fixture_image(json: &serde_json::Value) -> Texture {
    let shape: Vec<usize> =
        json["shape"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
    let pixels = floats(&json["pixels"]);
    Texture::from_image(shape[1], shape[0], shape[2], &pixels)
}

fn floats(json: &serde_json::Value) -> Vec<f32> {
    json.as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect()
}

/// Every case ComfyUI drew (scripts/reference/glsl_shader.py: ANGLE on Mesa's llvmpipe), drawn again.
#[test]
fn every_shader_draws_what_comfyui_draws() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/glsl");
    let text = std::fs::read_to_string(dir.join("reference.json")).unwrap();
    let fixture: serde_json::Value = serde_json::from_str(&text).unwrap();
    let images: std::collections::HashMap<&str, Texture> = fixture["images"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, json)| (name.as_str(), fixture_image(json)))
        .collect();
    let mut worst = 0.0f32;
    for (k, case) in fixture["cases"].as_array().unwrap().iter().enumerate() {
        let file = case["shader"].as_str().unwrap();
        let source = std::fs::read_to_string(dir.join(file)).unwrap();
        let shader = Shader::compile(&source).unwrap_or_else(|e| panic!("{file}: {e}"));
        let bound: Vec<&Texture> = case["images"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| &images[n.as_str().unwrap()])
            .collect();
        let luts: Vec<Texture> = case["luts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|lut| Texture::lookup_table(&floats(lut)))
            .collect();
        let mut textures: Vec<(String, &Texture)> =
            bound.iter().enumerate().map(|(i, t)| (format!("u_image{i}"), *t)).collect();
        textures.extend(luts.iter().enumerate().map(|(i, t)| (format!("u_curve{i}"), t)));
        let mut uniforms = Vec::new();
        for (i, f) in floats(&case["floats"]).into_iter().enumerate() {
            uniforms.push((format!("u_float{i}"), Uniform::Float(f)));
        }
        for (i, v) in case["ints"].as_array().unwrap().iter().enumerate() {
            uniforms.push((format!("u_int{i}"), Uniform::Int(v.as_i64().unwrap() as i32)));
        }
        for (i, v) in case["bools"].as_array().unwrap().iter().enumerate() {
            uniforms.push((format!("u_bool{i}"), Uniform::Int(i32::from(v.as_bool().unwrap()))));
        }
        let (w, h) =
            (case["width"].as_u64().unwrap() as usize, case["height"].as_u64().unwrap() as usize);
        let bindings = Bindings { textures, uniforms, unit0: bound[0] };
        let out = shader
            .render(w, h, &bindings, 2, &|| false)
            .unwrap_or_else(|e| panic!("case {k} ({file}): {e}"))
            .unwrap();
        let expected = case["outputs"].as_array().unwrap();
        assert_eq!(out.len(), expected.len(), "case {k} ({file}): outputs");
        for (o, (image, want)) in out.iter().zip(expected).enumerate() {
            let want = floats(want);
            let got: Vec<f32> = image.iter().flatten().copied().collect();
            assert_eq!(got.len(), want.len());
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                let diff = (a - b).abs();
                worst = worst.max(diff);
                assert!(
                    diff <= 2e-5,
                    "case {k} ({file}) output {o}, pixel {} channel {}: {a} against ComfyUI's {b}",
                    i / 4,
                    i % 4
                );
            }
        }
    }
    eprintln!("largest difference from ComfyUI: {worst:e}");
}

/// The message a shader that cannot run fails with (compiled, then drawn over one pixel with `u_int0` = 5).
fn failure(source: &str) -> String {
    let texture = Texture::from_image(1, 1, 3, &[0.0; 3]);
    let shader = match Shader::compile(source) {
        Ok(shader) => shader,
        Err(e) => return e.to_string(),
    };
    let bindings = Bindings {
        textures: vec![("u_image0".to_owned(), &texture)],
        uniforms: vec![("u_int0".to_owned(), Uniform::Int(5))],
        unit0: &texture,
    };
    match shader.render(1, 1, &bindings, 1, &|| false) {
        Ok(_) => panic!("the shader ran"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn what_kiln_cannot_run_is_refused_by_name() {
    let head =
        "#version 300 es\nprecision highp float;\nuniform int u_int0;\nout vec4 fragColor0;\n";
    let cases = [
        ("void main() { fragColor0 = vec4(dFdx(1.0)); }", "`dFdx` needs neighbouring pixels"),
        (
            "in vec3 v_normal;\nvoid main() { fragColor0 = vec4(v_normal, 1.0); }",
            "input `v_normal`",
        ),
        (
            "uniform Params { float gain; };\nvoid main() { fragColor0 = vec4(gain); }",
            "uniform blocks",
        ),
        ("#if 1\n#endif\nvoid main() { fragColor0 = vec4(1.0); }", "`#if` is not supported"),
        ("#define F(x) x\nvoid main() { fragColor0 = vec4(1.0); }", "function-like macro `F`"),
        ("void main() { fragColor0 = vec4(1.0) + vec3(1.0); }", "cannot combine vec4 with vec3"),
        (
            "void main() { float a[2]; fragColor0 = vec4(a[u_int0]); }",
            "index 5 is out of range for 2",
        ),
        ("void main() { u_int0 = 1; fragColor0 = vec4(1.0); }", "`u_int0` is read-only"),
        ("void main() { fragColor0 = vec4(frob(1.0)); }", "no function `frob`"),
        ("void f() { }", "no `void main()`"),
    ];
    for (body, expected) in cases {
        let message = failure(&format!("{head}{body}"));
        assert!(message.contains(expected), "{body}: {message}");
    }
}

#[test]
fn discarded_pixels_and_unwritten_outputs_are_transparent_black() {
    let (texture, _) = gradient(2, 1);
    let out = render(
        "#version 300 es\nprecision highp float;\nlayout(location = 0) out vec4 fragColor0;\n\
         layout(location = 1) out vec4 fragColor1;\n\
         void main() { if (gl_FragCoord.x > 1.0) discard; fragColor0 = vec4(1.0); }",
        &texture,
        Vec::new(),
    );
    assert_eq!(out.len(), 2, "two outputs named");
    assert_eq!(out[0], [[1.0; 4], [0.0; 4]]);
    assert_eq!(out[1], [[0.0; 4], [0.0; 4]]);
}

#[test]
fn the_reviewed_corner_cases_behave_as_glsl() {
    let (texture, _) = gradient(1, 1);
    let one = |body: &str| -> [f32; 4] {
        let source = format!(
            "#version 300 es\nprecision highp float;\nuniform float u_float0;\nuniform sampler2D u_image0;\n\
             layout(location = 0) out vec4 fragColor0;\n{body}"
        );
        render(&source, &texture, vec![("u_float0".to_owned(), Uniform::Float(0.0))])[0][0]
    };
    // An unsized array sized by its (folded) initialiser, a local constant as a size.
    assert_eq!(
        one(
            "void main() { const int R = 1; float w[] = float[](1.0, 2.0, 3.0); float v[2 * R + 1];\n\
             fragColor0 = vec4(float(w.length()), float(v.length()), w[2], 0.0); }"
        ),
        [3.0, 3.0, 3.0, 0.0]
    );
    // Floats compare as numbers.
    assert_eq!(one("void main() { float s = -u_float0; fragColor0 = vec4(s == 0.0); }"), [1.0; 4]);
    // An index with a side effect runs once.
    assert_eq!(
        one("void main() { float a[3] = float[](1.0, 2.0, 3.0); int k = 0; a[k++] += 10.0;\n\
             fragColor0 = vec4(a[0], a[1], float(k), 0.0); }"),
        [11.0, 2.0, 1.0, 0.0]
    );
    // An out argument's index is taken before the call.
    assert_eq!(
        one("int g = 0; void f(out float v) { g = 2; v = 1.0; }\n\
             void main() { float a[3]; f(a[g]); fragColor0 = vec4(a[0], a[2], 0.0, 0.0); }"),
        [1.0, 0.0, 0.0, 0.0]
    );
    // Overloads told apart by an out argument's type.
    assert_eq!(
        one("void get(out float v) { v = 1.0; } void get(out vec2 v) { v = vec2(2.0); }\n\
             void main() { vec2 p; get(p); fragColor0 = vec4(p, 0.0, 0.0); }"),
        [2.0, 2.0, 0.0, 0.0]
    );
    // Sampling far outside reads the edge; a division by zero does not panic.
    assert_eq!(
        one("void main() { fragColor0 = texture(u_image0, vec2(1.0) / u_float0); }")[3],
        1.0
    );
}

#[test]
fn passes_are_counted_as_comfyui_counts_them() {
    // ComfyUI's regular expression finds the first `#pragma passes N`, in a comment too.
    let shader = Shader::compile(
        "#version 300 es\n// try \"#pragma passes 2\" for more\nprecision highp float;\n\
         out vec4 fragColor;\nvoid main() { fragColor = vec4(1.0); }",
    )
    .unwrap();
    assert_eq!(shader.passes, 2);
    assert!(
        failure("#version 300 es\nprecision highp float; #version 7\nvoid main() {}")
            .contains("may only begin")
    );
    let two = "#version 300 es\nout vec4 fragColor0;\nout vec4 fragColor1;\nvoid main() {}";
    assert!(failure(two).contains("each needs `layout(location = N)`"));
    let deep = format!("void main() {{ float x = {}1.0{}; }}", "(".repeat(300), ")".repeat(300));
    assert!(failure(&deep).contains("brackets nest 301 deep"));
    let long = format!("void main() {{ float x = 1.0{}; }}", " + 1.0".repeat(2000));
    assert!(failure(&long).contains("nest deeper than 256"), "{}", failure(&long));
}
