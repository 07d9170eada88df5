//! Times Kiln's GLSL interpreter drawing shaders over a square image, as `bench/cpu/glsl-shader.sh` compares
//! it with ComfyUI's renderer: `glsl_timing SIDE THREADS SHADER.frag...` prints one JSON line per shader
//! (`{"shader", "side", "seconds"}`). The image and uniforms are bench/cpu/glsl_shader.py's: pixel values
//! `(i · 7919 mod 1000) / 1000` over the flattened RGB image, `u_float0`…`u_float9` = 30…39.

use std::io::Write;

use kiln_engine::shader::{Bindings, Shader, Texture, Uniform};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [side, threads, shaders @ ..] = args.as_slice() else {
        return Err("usage: glsl_timing SIDE THREADS SHADER.frag...".into());
    };
    let (side, threads): (usize, usize) = (side.parse()?, threads.parse()?);
    let pixels: Vec<f32> =
        (0..side * side * 3).map(|i| ((i * 7919) % 1000) as f32 / 1000.0).collect();
    let image = Texture::from_image(side, side, 3, &pixels);
    let mut out = std::io::stdout();
    for path in shaders {
        let shader = Shader::compile(&std::fs::read_to_string(path)?)?;
        let uniforms =
            (0..10).map(|i| (format!("u_float{i}"), Uniform::Float(30.0 + i as f32))).collect();
        let bindings =
            Bindings { textures: vec![("u_image0".to_owned(), &image)], uniforms, unit0: &image };
        let started = std::time::Instant::now();
        shader.render(side, side, &bindings, threads, &|| false)?;
        let seconds = started.elapsed().as_secs_f64();
        let name = std::path::Path::new(path).file_name().and_then(|n| n.to_str()).unwrap_or(path);
        writeln!(out, "{{\"shader\": \"{name}\", \"side\": {side}, \"seconds\": {seconds:.4}}}")?;
    }
    Ok(())
}
