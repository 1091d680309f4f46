// File-level quantization: copy metadata, convert tensors row by row in parallel, stream the result to disk.
#include "format/quantize_file.h"

#include <sys/stat.h>

#include <cstring>
#include <memory>

#include "core/error.h"
#include "core/threads.h"
#include "format/gguf.h"
#include "format/quant.h"

namespace strata {

QuantizeRule parse_quantize_rule(const std::string &text) {
    size_t eq = text.rfind('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == text.size())
        fail("quantize rule '%s': expected REGEX=TYPE, e.g. 'ffn_down_exps=Q6_K'", text.c_str());
    std::string pattern = text.substr(0, eq), type_name = text.substr(eq + 1);
    std::optional<DType> type = dtype_from_name(type_name);
    if (!type) fail("quantize rule '%s': unknown type '%s'", text.c_str(), type_name.c_str());
    try {
        std::regex re(pattern);
    } catch (const std::regex_error &e) {
        fail("quantize rule '%s': bad regular expression '%s': %s", text.c_str(), pattern.c_str(), e.what());
    }
    return {pattern, *type};
}

DType choose_quantized_type(const QuantizeOptions &opt, const std::string &name, DType current, int n_dims,
                            int64_t ne0) {
    if (n_dims <= 1 && opt.keep_1d) return current;
    DType target = opt.default_type;
    for (const QuantizeRule &r : opt.rules) {
        if (std::regex_search(name, std::regex(r.pattern))) {
            target = r.type;
            break;
        }
    }
    if (ne0 % dtype_info(target).block_size != 0) return current;
    if (target != current && (!can_quantize(target) || !can_dequantize(current))) return current;
    return target;
}

void gguf_copy_kv(GgufWriter &w, const GgufKV &kv) {
    std::string key(kv.key);
    const GgufValue &v = kv.value;
    switch (v.type) {
        case GgufType::U8: w.add_u8(key, uint8_t(v.u)); break;
        case GgufType::I8: w.add_i8(key, int8_t(v.i)); break;
        case GgufType::U16: w.add_u16(key, uint16_t(v.u)); break;
        case GgufType::I16: w.add_i16(key, int16_t(v.i)); break;
        case GgufType::U32: w.add_u32(key, uint32_t(v.u)); break;
        case GgufType::I32: w.add_i32(key, int32_t(v.i)); break;
        case GgufType::U64: w.add_u64(key, v.u); break;
        case GgufType::I64: w.add_i64(key, v.i); break;
        case GgufType::F32: w.add_f32(key, float(v.f)); break;
        case GgufType::F64: w.add_f64(key, v.f); break;
        case GgufType::BOOL: w.add_bool(key, v.u != 0); break;
        case GgufType::STRING: w.add_string(key, std::string(v.str)); break;
        case GgufType::ARRAY:
            if (v.elem_type == GgufType::STRING) {
                std::vector<std::string> strs(v.array_strs.begin(), v.array_strs.end());
                w.add_string_array(key, std::move(strs));
            } else {
                w.add_array(key, v.elem_type, v.array_data, v.count);
            }
            break;
    }
}

namespace {

// llama.cpp's general.file_type for a file whose bulk is `t` (the "mostly" type).
uint32_t file_type_for(DType t) {
    switch (t) {
        case DType::F32: return 0;
        case DType::F16: return 1;
        case DType::Q4_0: return 2;
        case DType::Q4_1: return 3;
        case DType::Q8_0: return 7;
        case DType::Q5_0: return 8;
        case DType::Q5_1: return 9;
        case DType::Q2_K: return 10;
        case DType::Q3_K: return 12;
        case DType::Q4_K: return 15;
        case DType::Q5_K: return 17;
        case DType::Q6_K: return 18;
        case DType::IQ2_XXS: return 19;
        case DType::IQ2_XS: return 20;
        case DType::IQ3_XXS: return 23;
        case DType::IQ1_S: return 24;
        case DType::IQ4_NL: return 25;
        case DType::IQ3_S: return 26;
        case DType::IQ2_S: return 28;
        case DType::IQ4_XS: return 30;
        case DType::IQ1_M: return 31;
        case DType::BF16: return 32;
        case DType::MXFP4: return 38;
        default: return 0;
    }
}

struct ConvertJob {
    const GgufTensor *src = nullptr;
    DType dst_type = DType::F32;
    ThreadPool *pool = nullptr;
};

void fill_converted(void *ctx, uint8_t *dst, size_t n_bytes) {
    const ConvertJob &job = *static_cast<const ConvertJob *>(ctx);
    const GgufTensor &t = *job.src;
    if (job.dst_type == t.type) {
        STRATA_ASSERT(n_bytes == t.n_bytes);
        std::memcpy(dst, t.data, n_bytes);
        return;
    }
    const int64_t ne0 = t.ne[0];
    const int64_t n_rows = t.n_elements() / ne0;
    const size_t src_row = row_bytes(t.type, ne0), dst_row = row_bytes(job.dst_type, ne0);
    STRATA_ASSERT(n_bytes == dst_row * size_t(n_rows));
    job.pool->parallel_for(n_rows, 1, [&](int64_t r0, int64_t r1) {
        std::vector<float> row(static_cast<size_t>(ne0));
        for (int64_t r = r0; r < r1; r++) {
            dequantize_row(t.type, t.data + size_t(r) * src_row, row.data(), ne0);
            quantize_row(job.dst_type, row.data(), dst + size_t(r) * dst_row, ne0);
        }
    });
}

}  // namespace

namespace {

bool is_float_type(DType t) {
    return t == DType::F32 || t == DType::F16 || t == DType::BF16;
}

}  // namespace

QuantizeReport quantize_file(const std::string &in_path, const std::string &out_path, const QuantizeOptions &opt) {
    struct stat si {}, so {};
    if (::stat(in_path.c_str(), &si) == 0 && ::stat(out_path.c_str(), &so) == 0 && si.st_dev == so.st_dev &&
        si.st_ino == so.st_ino)
        fail("%s: the output is the input file; write the converted file elsewhere", out_path.c_str());
    std::unique_ptr<GgufFile> in = GgufFile::open(in_path);
    ThreadPool pool(opt.n_threads);
    GgufWriter w;
    if (in->alignment() != 32) w.set_alignment(in->alignment());
    for (const GgufKV &kv : in->kvs()) {
        if (kv.key == "general.file_type" || kv.key == "general.alignment") continue;
        gguf_copy_kv(w, kv);
    }
    w.add_u32("general.file_type", file_type_for(opt.default_type));

    QuantizeReport report;
    std::vector<std::unique_ptr<ConvertJob>> jobs;
    for (const GgufTensor &t : in->tensors()) {
        auto job = std::make_unique<ConvertJob>();
        job->src = &t;
        job->dst_type = choose_quantized_type(opt, std::string(t.name), t.type, t.n_dims, t.ne[0]);
        if (job->dst_type != t.type && !is_float_type(t.type) && !is_float_type(job->dst_type) && !opt.allow_requantize)
            fail("%s: tensor '%.*s' is already %s; converting it to %s loses precision twice (give "
                 "--allow-requantize to do it anyway, or a rule that keeps its type)",
                 in_path.c_str(), int(t.name.size()), t.name.data(), dtype_name(t.type), dtype_name(job->dst_type));
        job->pool = &pool;
        std::vector<int64_t> ne(t.ne, t.ne + t.n_dims);
        w.add_tensor_lazy(std::string(t.name), job->dst_type, ne, fill_converted, job.get());
        report.n_tensors++;
        report.n_converted += job->dst_type != t.type;
        report.bytes_in += t.n_bytes;
        report.bytes_out += row_bytes(job->dst_type, t.ne[0]) * size_t(t.n_elements() / t.ne[0]);
        jobs.push_back(std::move(job));
    }
    w.write(out_path);
    return report;
}

}  // namespace strata
