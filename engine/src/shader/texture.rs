//! The textures a shader samples: RGBA float texels stored as OpenGL stores them (row 0 at the bottom), read
//! with linear filtering and clamped to the edge, as ComfyUI sets up every texture of `GLSLShader`.

/// An RGBA32F texture without mipmaps.
#[derive(Clone, Debug)]
pub struct Texture {
    width: usize,
    height: usize,
    /// Texels, bottom row first.
    texels: Vec<[f32; 4]>,
}

impl Texture {
    /// A texture of `width` × `height` from `channels`-channel pixels in image order (top row first), as
    /// ComfyUI uploads them: flipped to OpenGL's bottom-up rows, a missing alpha set to 1 (three channels),
    /// one channel read as red with green and blue 0 and alpha 1 (OpenGL's `GL_RED`).
    pub fn from_image(width: usize, height: usize, channels: usize, pixels: &[f32]) -> Texture {
        let mut texels = Vec::with_capacity(width * height);
        for row in (0..height).rev() {
            for col in 0..width {
                let p = &pixels[(row * width + col) * channels..][..channels];
                texels.push(match channels {
                    1 => [p[0], 0.0, 0.0, 1.0],
                    2 => [p[0], p[1], 0.0, 1.0],
                    3 => [p[0], p[1], p[2], 1.0],
                    _ => [p[0], p[1], p[2], p[3]],
                });
            }
        }
        Texture { width, height, texels }
    }

    /// A texture of texels already bottom-up (a pass's output read by the next pass).
    pub(super) fn from_texels(width: usize, height: usize, texels: Vec<[f32; 4]>) -> Texture {
        Texture { width, height, texels }
    }

    /// A one-row `GL_R32F` texture of `values` (a curve's lookup table).
    pub fn lookup_table(values: &[f32]) -> Texture {
        let texels = values.iter().map(|&v| [v, 0.0, 0.0, 1.0]).collect();
        Texture { width: values.len(), height: 1, texels }
    }

    /// Width and height in texels.
    pub fn size(&self) -> (usize, usize) {
        (self.width, self.height)
    }

    /// The texel at column `x`, row `y` from the bottom, or zeros outside the texture (where OpenGL ES 3.0
    /// leaves `texelFetch` undefined).
    pub fn fetch(&self, x: i32, y: i32) -> [f32; 4] {
        match (usize::try_from(x), usize::try_from(y)) {
            (Ok(x), Ok(y)) if x < self.width && y < self.height => self.texels[y * self.width + x],
            _ => [0.0; 4],
        }
    }

    /// `texture()` at normalised coordinates `(s, t)`: the four nearest texels weighed linearly
    /// (`GL_LINEAR`), coordinates clamped to the edge texels (`GL_CLAMP_TO_EDGE`).
    pub fn sample(&self, s: f32, t: f32) -> [f32; 4] {
        if self.texels.is_empty() {
            return [0.0; 4];
        }
        let axis = |coord: f32, size: usize| {
            // Far outside (or NaN) reads the edge, as clamping to it would; the clamp keeps the integer part
            // in range.
            let u = (coord * size as f32 - 0.5).clamp(-1.0, size as f32);
            let u = if u.is_nan() { 0.0 } else { u };
            let floor = u.floor();
            let last = size as i64 - 1;
            let clamp = |i: i64| i.clamp(0, last) as usize;
            let i0 = floor as i64;
            (clamp(i0), clamp(i0 + 1), u - floor)
        };
        let (x0, x1, a) = axis(s, self.width);
        let (y0, y1, b) = axis(t, self.height);
        let at = |x: usize, y: usize| self.texels[y * self.width + x];
        let (t00, t10, t01, t11) = (at(x0, y0), at(x1, y0), at(x0, y1), at(x1, y1));
        let mut out = [0.0; 4];
        for c in 0..4 {
            let bottom = t00[c] * (1.0 - a) + t10[c] * a;
            let top = t01[c] * (1.0 - a) + t11[c] * a;
            out[c] = bottom * (1.0 - b) + top * b;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texel_centres_read_their_texel_and_edges_clamp() {
        // Two rows: the image's top row (1, 2) becomes OpenGL's row 1.
        let texture = Texture::from_image(2, 2, 1, &[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(texture.sample(0.25, 0.75)[0], 1.0);
        assert_eq!(texture.sample(0.75, 0.25)[0], 4.0);
        assert_eq!(texture.sample(0.5, 0.75)[0], 1.5);
        assert_eq!(texture.sample(-3.0, 0.25)[0], 3.0);
        assert_eq!(texture.fetch(0, 0), [3.0, 0.0, 0.0, 1.0]);
        assert_eq!(texture.fetch(2, 0), [0.0; 4]);
    }
}
