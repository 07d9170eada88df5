//! The built-in node classes: images, latents, primitives, previews (files and websocket frames), the lazy
//! switch, and the model nodes (loaders, text encoding, sampling, VAE).

mod anima_text;
mod ar_video;
mod attention_multiply;
mod audio;
mod audio_encoder;
mod audio_mix;
mod bernini;
mod boogu;
mod chroma_radiance;
mod clip_vision;
mod compose;
mod concat;
mod conditioning;
mod conditioning_area;
mod conditioning_ops;
mod context_windows;
mod controlnet;
mod curve;
mod custom_sampling;
mod expression;
mod files;
mod filters;
mod glsl;
mod guidance;
mod hints;
mod humo;
mod hunyuan_video;
mod image;
mod infinite_talk;
mod inpaint;
mod joyimage;
mod kandinsky5;
mod kv_cache;
mod latent;
mod latent_file;
mod latent_operation;
mod latent_ops;
mod latent_transform;
mod loaders;
mod logic;
mod lotus;
mod mage;
mod mask;
mod mask_ops;
mod model_patch;
mod model_specs;
mod morphology;
mod nop;
mod orient;
mod painter;
mod pil_lanczos;
mod porter_duff;
mod primitives;
mod prompt_regions;
mod pure;
mod qwen;
mod qwen3vl_edit;
mod rebatch_latents;
mod resize;
mod rope;
mod sampler;
mod scale;
mod sdxl_adm;
mod step_cache;
mod stitch;
mod strings;
mod text;
mod textgen;
mod tiled;
mod unclip;
mod upscale;
mod vae;
mod video;
mod wan;
mod wan_animate;
mod wan_camera;
mod wan_concat;
mod wan_dancer;
mod wan_fun_control;
mod wan_move;
mod wan_move_draw;
mod wan_phantom;
mod wan_sound;
mod wan_track;
mod wan_vace;
mod websocket;
mod windowed;

use super::Registry;
use crate::models::ModelEnv;
use crate::roots::Roots;

/// A registry with every built-in node; the file nodes list and read the folders of `roots` (`LoadImage` the
/// input folder, and the output and temp folders for names annotated so), the model nodes list and load the
/// files of `models` and run on its device.
pub fn builtin_registry(roots: &Roots, models: ModelEnv) -> Registry {
    let input_dir = roots.input.clone();
    // ComfyUI's order: its core `nodes.py` classes as `NODE_CLASS_MAPPINGS` declares them, then the
    // `comfy_extras` modules, then custom nodes (`SaveImageWebsocket` ships as one). `/object_info` lists them so.
    let compute = models.compute.clone();
    let mut registry = Registry::new();
    registry.register(sampler::KSampler::new(compute.clone()));
    registry.register(loaders::CheckpointLoaderSimple(models.clone()));
    registry.register(conditioning::ClipTextEncode::new(compute.clone()));
    registry.register(conditioning::ClipTextEncodeFlux::new(compute.clone()));
    registry.register(conditioning::ClipTextEncodeHiDream::new(compute.clone()));
    registry.register(conditioning::ClipTextEncodeLumina2::new(compute.clone()));
    registry.register(vae::VaeDecode::new(compute.clone()));
    registry.register(vae::VaeEncode::new(compute.clone()));
    registry.register(loaders::VaeLoader(models.clone()));
    registry.register(controlnet::ControlNetLoader(models.clone()));
    registry.register(controlnet::ControlNetApply::advanced());
    registry.register(controlnet::ControlNetApply::inpainting());
    registry.register(model_patch::ModelPatchLoader(models.clone()));
    registry.register(model_patch::QwenImageDiffsynthControlnet::new());
    registry.register(model_patch::QwenImageDiffsynthControlnet::z_image());
    registry.register(model_patch::uso_style_reference_node());
    registry.register(model_patch::anima_lllite_apply_node());
    registry.register(latent::EmptyLatentImage::new());
    registry.register(latent::LatentUpscale::new());
    registry.register(files::SaveImage::new());
    registry.register(files::PreviewImage::new());
    registry.register(files::LoadImage::new(roots.clone()));
    registry.register(files::LoadImageMask::new(roots.clone()));
    registry.register(files::LoadImageOutput::new(roots.clone()));
    registry.register(painter::Painter::new(input_dir.clone()));
    registry.register(image::ImageScale::new());
    registry.register(image::ImageScaleBy::new());
    registry.register(image::ImageInvert::new());
    registry.register(image::ImageBatch::new());
    registry.register(image::EmptyImage::new());
    registry.register(image::ImageBlend::new());
    registry.register(conditioning::ConditioningCombine::new());
    for node in conditioning_ops::nodes() {
        registry.register(node);
    }
    for node in conditioning_area::nodes() {
        registry.register(node);
    }
    registry.register(sampler::KSamplerAdvanced::new(compute.clone()));
    registry.register(loaders::ClipLoader(models.clone()));
    registry.register(loaders::UnetLoader(models.clone()));
    registry.register(loaders::LoraLoader(models.clone()));
    registry.register(loaders::MultiClipLoader::new(models.clone(), loaders::MultiClip::Dual));
    registry.register(clip_vision::ClipVisionEncode::new(compute.clone()));
    registry.register(clip_vision::StyleModelApply::new(compute.clone()));
    registry.register(clip_vision::StyleModelLoader(models.clone()));
    registry.register(clip_vision::ClipVisionLoader(models.clone()));
    registry.register(upscale::UpscaleModelLoader(models.clone()));
    registry.register(audio_encoder::AudioEncoderLoader(models.clone()));
    registry.register(audio_encoder::AudioEncoderEncode::new(compute.clone()));
    registry.register(upscale::ImageUpscaleWithModel::new(compute.clone()));
    registry.register(vae::VaeTiled::decode(compute.clone()));
    registry.register(vae::VaeTiled::encode(compute.clone()));
    registry.register(conditioning::ConditioningZeroOut::new());
    registry.register(conditioning::t5_tokenizer_options());
    registry.register(lotus::LotusConditioning::new());
    registry.register(loaders::LoraLoaderModelOnly(models.clone()));
    registry.register(inpaint::InpaintModelConditioning::new(compute.clone()));
    registry.register(inpaint::VaeEncodeForInpaint::new(compute.clone()));
    registry.register(inpaint::pad_node());
    registry.register(image::GetImageSize::new());
    for node in primitives::primitives() {
        registry.register(node);
    }
    registry.register(sampler::ModelSamplingAuraFlow::new());
    registry.register(sampler::EmptySd3LatentImage::new());
    registry.register(primitives::PreviewAny::new());
    registry.register(primitives::bounding_box());
    registry.register(primitives::seed());
    registry.register(primitives::colour_picker());
    registry.register(logic::ComfySwitchNode::new());
    registry.register(logic::custom_combo());
    registry.register(logic::CreateList::new());
    for node in logic::boolean_nodes() {
        registry.register(node);
    }
    registry.register(websocket::SaveImageWebsocket::new());
    registry.register(video::save_animated_webp());
    registry.register(video::save_animated_png());
    registry.register(files::SaveImageAdvanced::new());
    registry.register(custom_sampling::ModelSamplingSd3::new());
    registry.register(custom_sampling::ModelSamplingFlux::new());
    for node in custom_sampling::builders() {
        registry.register(node);
    }
    registry.register(custom_sampling::SamplerCustom::new(compute.clone()));
    registry.register(custom_sampling::SamplerCustomAdvanced::new(compute.clone()));
    for node in text::nodes() {
        registry.register(node);
    }
    for node in strings::nodes() {
        registry.register(node);
    }
    for node in guidance::nodes() {
        registry.register(node);
    }
    for node in mask::nodes() {
        registry.register(node);
    }
    for node in mask_ops::nodes() {
        registry.register(node);
    }
    for node in orient::nodes() {
        registry.register(node);
    }
    for node in latent::nodes() {
        registry.register(node);
    }
    registry.register(stitch::node());
    for node in conditioning::extras_nodes() {
        registry.register(node);
    }
    registry.register(qwen::TextEncodeQwenImageEdit::edit(compute.clone()));
    registry.register(qwen::TextEncodeQwenImageEdit::plus(compute.clone()));
    registry.register(qwen::empty_layered_latent());
    registry.register(wan::empty_hunyuan_latent_video());
    registry.register(hunyuan_video::empty_hunyuan_video15_latent());
    registry.register(hunyuan_video::HunyuanVideo15ImageToVideo::new(compute.clone()));
    registry.register(kandinsky5::Kandinsky5ImageToVideo::new(compute.clone()));
    registry.register(kandinsky5::normalize_video_latent_start());
    registry.register(mage::TextEncodeMageFlowEdit::new(compute.clone()));
    registry.register(boogu::TextEncodeBooguEdit::new(compute.clone()));
    registry.register(joyimage::TextEncodeJoyImageEdit::new(compute.clone()));
    registry.register(chroma_radiance::options_node());
    registry.register(unclip::unclip_conditioning_node());
    registry.register(wan::WanImageToVideo::start(compute.clone()));
    registry.register(wan::WanImageToVideo::first_last(compute.clone()));
    registry.register(wan::WanImageToVideo::fun_inpaint(compute.clone()));
    registry.register(wan::Wan22ImageToVideoLatent::new(compute.clone()));
    registry.register(wan_phantom::WanPhantomSubjectToVideo::new(compute.clone()));
    registry.register(humo::WanHuMoImageToVideo::new(compute.clone()));
    registry.register(wan_dancer::WanDancerEncodeAudio::new());
    registry.register(wan_dancer::WanDancerVideo::new(compute.clone()));
    registry.register(wan_dancer::WanDancerPadKeyframes::single());
    registry.register(wan_dancer::WanDancerPadKeyframes::list());
    registry.register(infinite_talk::WanInfiniteTalkToVideo::new(compute.clone()));
    registry.register(wan_animate::WanAnimate2ToVideo::new(compute.clone()));
    registry.register(wan_animate::wan_animate2_cache());
    registry.register(context_windows::context_windows_manual());
    registry.register(context_windows::wan_context_windows_manual());
    registry.register(wan_sound::WanSoundImageToVideo::new(compute.clone()));
    registry.register(wan_sound::WanSoundImageToVideo::extend(compute.clone()));
    registry.register(wan_fun_control::WanFunControlToVideo::wan21(compute.clone()));
    registry.register(wan_fun_control::WanFunControlToVideo::wan22(compute.clone()));
    registry.register(wan_vace::WanVaceToVideo::new(compute.clone()));
    registry.register(wan_camera::wan_camera_embedding());
    registry.register(wan_camera::WanCameraImageToVideo::new(compute.clone()));
    registry.register(wan_track::WanTrackToVideo::new(compute.clone()));
    registry.register(wan_move::WanMoveTrackToVideo::new(compute.clone()));
    registry.register(bernini::BerniniConditioning::new(compute.clone()));
    for node in ar_video::builders() {
        registry.register(node);
    }
    registry.register(ar_video::ArVideoI2v::new(compute.clone()));
    registry.register(wan_move::concat_tracks());
    registry.register(wan_move::generate_tracks());
    registry.register(wan_move::tracks_from_coords());
    registry.register(wan_move_draw::visualize_tracks());
    registry.register(nop::wan_block_swap());
    registry.register(wan::trim_video_latent());
    registry.register(attention_multiply::unet_temporal_attention_multiply());
    registry.register(rope::scale_rope());
    for node in latent::empty_nodes() {
        registry.register(node);
    }
    for node in latent::advanced_nodes() {
        registry.register(node);
    }
    for node in latent_ops::nodes() {
        registry.register(node);
    }
    for node in latent_transform::nodes() {
        registry.register(node);
    }
    registry.register(latent_file::SaveLatent::new());
    registry.register(latent_file::LoadLatent::new(input_dir.clone()));
    for node in latent::compositing_nodes() {
        registry.register(node);
    }
    for node in scale::nodes() {
        registry.register(node);
    }
    registry.register(inpaint::InstructPixToPixConditioning::new(compute.clone()));
    registry.register(loaders::MultiClipLoader::new(models.clone(), loaders::MultiClip::Triple));
    registry.register(loaders::MultiClipLoader::new(models, loaders::MultiClip::Quadruple));
    registry.register(inpaint::differential_diffusion_node());
    registry.register(kv_cache::flux_kv_cache_node());
    for node in step_cache::nodes() {
        registry.register(node);
    }
    registry.register(audio::save_audio());
    registry.register(audio::save_audio_mp3());
    registry.register(audio::save_audio_opus());
    registry.register(audio::save_audio_advanced());
    registry.register(audio::LoadAudio::new(input_dir.clone()));
    registry.register(audio::preview_audio());
    registry.register(audio::trim_audio_duration());
    registry.register(audio::audio_concat());
    registry.register(audio::record_audio());
    registry.register(audio_mix::empty_audio());
    registry.register(audio_mix::split_audio_channels());
    registry.register(audio_mix::join_audio_channels());
    registry.register(audio_mix::audio_merge());
    registry.register(audio_mix::audio_adjust_volume());
    registry.register(audio_mix::audio_equalizer_3band());
    registry.register(latent_operation::tonemap_reinhard());
    registry.register(latent_operation::sharpen());
    registry.register(latent_operation::apply());
    registry.register(latent_operation::apply_cfg());
    registry.register(video::save_webm());
    registry.register(video::save_video());
    registry.register(video::create_video());
    registry.register(video::get_video_components());
    registry.register(video::LoadVideo::new(input_dir));
    registry.register(video::video_slice());
    registry.register(files::MaskPreview::new());
    registry.register(files::ImageCompare::new());
    registry.register(glsl::GlslShader::new());
    registry.register(textgen::TextGenerate::new(compute.clone()));
    for node in filters::nodes() {
        registry.register(node);
    }
    for node in morphology::nodes() {
        registry.register(node);
    }
    for node in porter_duff::nodes() {
        registry.register(node);
    }
    for node in compose::nodes() {
        registry.register(node);
    }
    registry.register(compose::RebatchImages::new());
    registry.register(rebatch_latents::RebatchLatents::new());
    registry.register(compose::ImageCropV2::new());
    registry.register(curve::CurveEditor::new());
    registry.register(curve::ImageHistogram::new());
    registry
}
