// llamacpp_greedy records a llama.cpp engine's greedy decoding of a GGUF file
// as golden JSON for Baton's token-exact tests.
//
// It links against the libllama it was built for: upstream llama.cpp
// (checked with c392e50 and with the newer d32676d, which has qwen3 and
// gemma3) or ik_llama.cpp (checked with 8337e4c); the few API differences are
// selected at compile time (GOLDEN_IK_API, GOLDEN_NEW_API, guessed from the
// header when not given). See scripts/golden/README.md for usage and the
// output format.
//
// Everything runs on the CPU with one thread. Each prompt gets a fresh
// context: the prompt is tokenized as llama-server's /tokenize does with
// add_special=true (llama_tokenize with add_special and parse_special both
// true), decoded as one batch, then one token per decode. At every step the
// argmax of the raw logits is chosen (lowest id on a tie), and the top
// tokens' log-probabilities under the plain softmax are computed in float64.

#include "llama.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#ifndef GOLDEN_IK_API
// Only ik_llama.cpp's llama.h defines the server state magic; upstream
// c392e50 does not. record.sh passes GOLDEN_IK_API explicitly.
#if defined(LLAMA_SERVER_MAGIC)
#define GOLDEN_IK_API 1
#else
#define GOLDEN_IK_API 0
#endif
#endif

// Upstream llama.cpp after mid-2025 (checked with d32676d): flash attention
// is chosen by llama_context_params.flash_attn_type instead of a bool. Its
// header defines the LLAMA_STATE_SEQ_FLAGS_* macros, which c392e50's lacks.
#ifndef GOLDEN_NEW_API
#if !GOLDEN_IK_API && defined(LLAMA_STATE_SEQ_FLAGS_NONE)
#define GOLDEN_NEW_API 1
#else
#define GOLDEN_NEW_API 0
#endif
#endif

#ifndef GOLDEN_ENGINE
#if GOLDEN_IK_API
#define GOLDEN_ENGINE "ik_llama.cpp"
#else
#define GOLDEN_ENGINE "llama.cpp"
#endif
#endif

#ifndef GOLDEN_ENGINE_COMMIT
#define GOLDEN_ENGINE_COMMIT "unknown"
#endif

namespace {

// ---- the API differences between the two engines ----

int tokenize(const llama_vocab *vocab, const std::string &text, std::vector<llama_token> &out) {
    out.assign(text.size() + 16, 0);
    for (int attempt = 0; attempt < 2; attempt++) {
#if GOLDEN_IK_API
        int n = llama_vocab_tokenize(vocab, text.data(), (int32_t)text.size(), out.data(), (int32_t)out.size(), true, true);
#else
        int n = llama_tokenize(vocab, text.data(), (int32_t)text.size(), out.data(), (int32_t)out.size(), true, true);
#endif
        if (n >= 0) {
            out.resize(n);
            return 0;
        }
        out.assign(-n, 0);
    }
    return -1;
}

std::string piece(const llama_vocab *vocab, llama_token id) {
    std::vector<char> buf(64);
    for (int attempt = 0; attempt < 2; attempt++) {
        // special=false: what llama-server puts in its text output.
#if GOLDEN_IK_API
        int n = llama_token_to_piece_vocab(vocab, id, buf.data(), (int32_t)buf.size(), 0, false);
#else
        int n = llama_token_to_piece(vocab, id, buf.data(), (int32_t)buf.size(), 0, false);
#endif
        if (n >= 0) {
            return std::string(buf.data(), n);
        }
        buf.resize(-n);
    }
    return std::string();
}

void free_model(llama_model *m) {
#if GOLDEN_IK_API
    llama_free_model(m);
#else
    llama_model_free(m);
#endif
}

// ---- SHA-256 (FIPS 180-4), so the JSON names the exact file ----

struct Sha256 {
    uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    uint8_t block[64];
    size_t fill = 0;
    uint64_t total = 0;

    static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

    void compress(const uint8_t *p) {
        static const uint32_t k[64] = {
            0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
            0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
            0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
            0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
            0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
            0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
            0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
            0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
        };
        uint32_t w[64];
        for (int i = 0; i < 16; i++) {
            w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
        }
        for (int i = 16; i < 64; i++) {
            uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
            uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16] + s0 + w[i - 7] + s1;
        }
        uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
        for (int i = 0; i < 64; i++) {
            uint32_t t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
            uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
            hh = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
        }
        h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
    }

    void update(const uint8_t *p, size_t n) {
        total += n;
        while (n > 0) {
            size_t take = std::min(n, sizeof(block) - fill);
            memcpy(block + fill, p, take);
            fill += take; p += take; n -= take;
            if (fill == 64) {
                compress(block);
                fill = 0;
            }
        }
    }

    std::string hex() {
        uint64_t bits = total * 8;
        uint8_t pad = 0x80;
        update(&pad, 1);
        uint8_t zero = 0;
        while (fill != 56) update(&zero, 1);
        uint8_t len[8];
        for (int i = 0; i < 8; i++) len[i] = (uint8_t)(bits >> (56 - 8 * i));
        update(len, 8);
        char out[65];
        for (int i = 0; i < 8; i++) snprintf(out + 8 * i, 9, "%08x", h[i]);
        return std::string(out, 64);
    }
};

bool file_sha256(const std::string &path, std::string &hex, uint64_t &size) {
    FILE *f = fopen(path.c_str(), "rb");
    if (!f) return false;
    Sha256 s;
    std::vector<uint8_t> buf(1 << 20);
    size_t n;
    while ((n = fread(buf.data(), 1, buf.size(), f)) > 0) s.update(buf.data(), n);
    bool ok = !ferror(f);
    fclose(f);
    size = s.total;
    hex = s.hex();
    return ok;
}

// ---- JSON output ----

// json_str quotes s as a JSON string. Bytes that are not valid UTF-8 (a
// byte-fallback token can be half a character) become U+FFFD.
std::string json_str(const std::string &s) {
    std::string o = "\"";
    const unsigned char *p = (const unsigned char *)s.data();
    size_t n = s.size(), i = 0;
    while (i < n) {
        unsigned char c = p[i];
        if (c < 0x80) {
            switch (c) {
            case '"': o += "\\\""; break;
            case '\\': o += "\\\\"; break;
            case '\n': o += "\\n"; break;
            case '\r': o += "\\r"; break;
            case '\t': o += "\\t"; break;
            default:
                if (c < 0x20 || c == 0x7f) {
                    char b[8];
                    snprintf(b, sizeof b, "\\u%04x", c);
                    o += b;
                } else {
                    o += (char)c;
                }
            }
            i++;
            continue;
        }
        int len = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c <= 0xdf ? 2 : 0;
        if (c >= 0xf5) len = 0;
        bool ok = len > 0 && i + len <= n;
        for (int k = 1; ok && k < len; k++) ok = (p[i + k] & 0xc0) == 0x80;
        if (ok && len == 3) {
            uint32_t cp = (c & 0x0f) << 12 | (p[i + 1] & 0x3f) << 6 | (p[i + 2] & 0x3f);
            ok = cp >= 0x800 && (cp < 0xd800 || cp > 0xdfff);
        }
        if (ok && len == 4) {
            uint32_t cp = (c & 0x07) << 18 | (p[i + 1] & 0x3f) << 12 | (p[i + 2] & 0x3f) << 6 | (p[i + 3] & 0x3f);
            ok = cp >= 0x10000 && cp <= 0x10ffff;
        }
        if (ok) {
            o.append(s, i, len);
            i += len;
        } else {
            o += "\xef\xbf\xbd";
            i++;
        }
    }
    return o + "\"";
}

std::string num(double v, const char *fmt = "%.12g") {
    if (std::isnan(v)) return "null";
    if (std::isinf(v)) return v > 0 ? "1e999" : "-1e999";
    char b[40];
    snprintf(b, sizeof b, fmt, v);
    return b;
}

std::string ids_json(const std::vector<llama_token> &ids) {
    std::string o = "[";
    for (size_t i = 0; i < ids.size(); i++) {
        if (i) o += ", ";
        o += std::to_string(ids[i]);
    }
    return o + "]";
}

// ---- prompts file ----

// unescape turns one prompts-file line into its text: \n newline, \t tab,
// \r carriage return, \\ backslash, \# a literal '#', \z nothing (so a line
// "\z" is the empty prompt). Any other escape is an error.
bool unescape(const std::string &line, std::string &out, std::string &err) {
    out.clear();
    for (size_t i = 0; i < line.size(); i++) {
        if (line[i] != '\\') {
            out += line[i];
            continue;
        }
        if (++i == line.size()) {
            err = "trailing backslash";
            return false;
        }
        switch (line[i]) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '\\': out += '\\'; break;
        case '#': out += '#'; break;
        case 'z': break;
        default:
            err = std::string("unknown escape \\") + line[i];
            return false;
        }
    }
    return true;
}

// read_prompts reads one prompt per line; blank lines and lines starting
// with '#' are skipped.
bool read_prompts(const std::string &path, std::vector<std::string> &prompts) {
    std::ifstream f(path, std::ios::binary);
    if (!f) {
        fprintf(stderr, "llamacpp_greedy: %s: %s\n", path.c_str(), strerror(errno));
        return false;
    }
    std::string line, text, err;
    int lineno = 0;
    while (std::getline(f, line)) {
        lineno++;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.empty() || line[0] == '#') continue;
        if (!unescape(line, text, err)) {
            fprintf(stderr, "llamacpp_greedy: %s:%d: %s\n", path.c_str(), lineno, err.c_str());
            return false;
        }
        prompts.push_back(text);
    }
    return true;
}

struct Options {
    std::string model, prompts, out;
    std::vector<std::string> commands, gen_args;
    std::string case_name;
    int steps = 48;
    int top = 2;
    std::string kv_type = "f32";
    int ctx = 0;
    int threads = 1;
    double low_margin = 1e-3;
    bool verbose = false;
};

const char *api_name() { return GOLDEN_IK_API ? "ik_llama.cpp" : GOLDEN_NEW_API ? "upstream-new" : "upstream"; }

void usage() {
    fprintf(stderr,
            "usage: llamacpp_greedy --model FILE.gguf --prompts FILE [--steps N] [--top K] [--ctx N]\n"
            "                       [--out FILE.json] [--command 'CMD' ...] [--case NAME] [--gen-model-arg ARG ...]\n"
            "                       [--low-margin X] [--kv-type f32|f16] [--threads N] [--verbose]\n"
            "Records greedy decoding (1 CPU thread) of each prompt as JSON (stdout without --out).\n"
            "Built against %s (commit %s, %s API).\n",
            GOLDEN_ENGINE, GOLDEN_ENGINE_COMMIT, api_name());
}

bool parse_args(int argc, char **argv, Options &o) {
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto val = [&](const char *name) -> const char * {
            if (i + 1 >= argc) {
                fprintf(stderr, "llamacpp_greedy: %s needs a value\n", name);
                return nullptr;
            }
            return argv[++i];
        };
        auto int_val = [&](const char *name, int &dst, int min) -> bool {
            const char *v = val(name);
            if (!v) return false;
            char *end;
            long x = strtol(v, &end, 10);
            if (*end || x < min || x > 1 << 20) {
                fprintf(stderr, "llamacpp_greedy: %s %s: want an integer >= %d\n", name, v, min);
                return false;
            }
            dst = (int)x;
            return true;
        };
        const char *v;
        if (a == "--model") {
            if (!(v = val("--model"))) return false;
            o.model = v;
        } else if (a == "--prompts") {
            if (!(v = val("--prompts"))) return false;
            o.prompts = v;
        } else if (a == "--out") {
            if (!(v = val("--out"))) return false;
            o.out = v;
        } else if (a == "--command") {
            if (!(v = val("--command"))) return false;
            o.commands.push_back(v);
        } else if (a == "--gen-model-arg") {
            if (!(v = val("--gen-model-arg"))) return false;
            o.gen_args.push_back(v);
        } else if (a == "--case") {
            if (!(v = val("--case"))) return false;
            o.case_name = v;
        } else if (a == "--steps") {
            if (!int_val("--steps", o.steps, 1)) return false;
        } else if (a == "--top") {
            if (!int_val("--top", o.top, 2)) return false;
        } else if (a == "--threads") {
            if (!int_val("--threads", o.threads, 1)) return false;
        } else if (a == "--ctx") {
            if (!int_val("--ctx", o.ctx, 0)) return false;
        } else if (a == "--low-margin") {
            if (!(v = val("--low-margin"))) return false;
            o.low_margin = atof(v);
        } else if (a == "--kv-type") {
            if (!(v = val("--kv-type"))) return false;
            o.kv_type = v;
            if (o.kv_type != "f32" && o.kv_type != "f16") {
                fprintf(stderr, "llamacpp_greedy: --kv-type %s: want f32 or f16\n", v);
                return false;
            }
        } else if (a == "--verbose") {
            o.verbose = true;
        } else if (a == "-h" || a == "--help") {
            usage();
            exit(0);
        } else {
            fprintf(stderr, "llamacpp_greedy: unknown argument %s\n", a.c_str());
            return false;
        }
    }
    if (o.model.empty() || o.prompts.empty()) {
        fprintf(stderr, "llamacpp_greedy: --model and --prompts are required\n");
        return false;
    }
    return true;
}

bool quiet_logs = true;

void log_cb(enum ggml_log_level level, const char *text, void *) {
    if (!quiet_logs || level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

struct Step {
    llama_token id;
    double margin;
    std::vector<std::pair<llama_token, float>> top; // id, raw logit
    std::vector<double> logprob;
    bool eog;
};

// analyse picks the greedy token from raw logits and the top-k
// log-probabilities (float64 softmax).
Step analyse(const float *logits, int n_vocab, int k, const llama_vocab *vocab) {
    std::vector<int> idx(n_vocab);
    for (int i = 0; i < n_vocab; i++) idx[i] = i;
    k = std::min(k, n_vocab);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) {
        if (logits[a] != logits[b]) return logits[a] > logits[b];
        return a < b;
    });
    double mx = logits[idx[0]];
    double sum = 0;
    for (int i = 0; i < n_vocab; i++) sum += std::exp((double)logits[i] - mx);
    double lse = std::log(sum);
    Step s;
    s.id = idx[0];
    for (int j = 0; j < k; j++) {
        s.top.push_back({idx[j], logits[idx[j]]});
        s.logprob.push_back((double)logits[idx[j]] - mx - lse);
    }
    s.margin = std::exp(s.logprob[0]) - std::exp(s.logprob[1]);
    s.eog = llama_vocab_is_eog(vocab, s.id);
    return s;
}

bool decode(llama_context *ctx, const std::vector<llama_token> &toks, int pos0) {
    llama_batch b = llama_batch_init((int32_t)toks.size(), 0, 1);
    for (size_t i = 0; i < toks.size(); i++) {
        b.token[i] = toks[i];
        b.pos[i] = pos0 + (int)i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = i + 1 == toks.size();
    }
    b.n_tokens = (int32_t)toks.size();
    int rc = llama_decode(ctx, b);
    llama_batch_free(b);
    if (rc != 0) fprintf(stderr, "llamacpp_greedy: llama_decode returned %d\n", rc);
    return rc == 0;
}

} // namespace

int main(int argc, char **argv) {
    Options o;
    if (!parse_args(argc, argv, o)) {
        usage();
        return 2;
    }
    quiet_logs = !o.verbose;
    llama_log_set(log_cb, nullptr);

    std::vector<std::string> prompts;
    if (!read_prompts(o.prompts, prompts)) return 1;
    if (prompts.empty()) {
        fprintf(stderr, "llamacpp_greedy: %s: no prompts\n", o.prompts.c_str());
        return 1;
    }
    std::string sha;
    uint64_t size = 0;
    if (!file_sha256(o.model, sha, size)) {
        fprintf(stderr, "llamacpp_greedy: %s: %s\n", o.model.c_str(), strerror(errno));
        return 1;
    }

    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
#if GOLDEN_IK_API
    mp.flash_attn = false;
#endif
    llama_model *model = llama_model_load_from_file(o.model.c_str(), mp);
    if (!model) {
        fprintf(stderr, "llamacpp_greedy: %s: the engine could not load it (rerun with --verbose)\n", o.model.c_str());
        return 1;
    }
    const llama_vocab *vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    char arch[128] = "";
    llama_model_meta_val_str(model, "general.architecture", arch, sizeof arch);
    char desc[256] = "";
    llama_model_desc(model, desc, sizeof desc);

    std::vector<std::vector<llama_token>> prompt_ids(prompts.size());
    size_t longest = 0;
    for (size_t p = 0; p < prompts.size(); p++) {
        if (tokenize(vocab, prompts[p], prompt_ids[p]) != 0) {
            fprintf(stderr, "llamacpp_greedy: prompt %zu: tokenization failed\n", p);
            return 1;
        }
        longest = std::max(longest, prompt_ids[p].size());
    }
    int n_ctx = o.ctx > 0 ? o.ctx : (int)longest + o.steps + 8;
    if ((int)longest + o.steps > n_ctx) {
        fprintf(stderr, "llamacpp_greedy: --ctx %d is smaller than the longest prompt (%zu) + steps (%d)\n", n_ctx, longest, o.steps);
        return 1;
    }

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = n_ctx;
    cp.n_ubatch = n_ctx;
    cp.n_seq_max = 1;
    cp.n_threads = o.threads;
    cp.n_threads_batch = o.threads;
#if GOLDEN_NEW_API
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
#else
    cp.flash_attn = false;
#endif
    // An F32 K/V cache by default: Baton's cache is float32, and llama.cpp's
    // default F16 one moves greedy choices on large random weights.
    const ggml_type kv = o.kv_type == "f16" ? GGML_TYPE_F16 : GGML_TYPE_F32;
    cp.type_k = kv;
    cp.type_v = kv;
    cp.embeddings = false;

    std::string js = "{\n";
    js += "  \"schema_version\": 1,\n";
    js += "  \"producer\": {\"program\": \"scripts/golden/llamacpp_greedy.cpp\", \"engine\": " + json_str(GOLDEN_ENGINE) +
          ", \"engine_commit\": " + json_str(GOLDEN_ENGINE_COMMIT) + ", \"api\": " +
          json_str(api_name()) + ", \"system_info\": " + json_str(llama_print_system_info()) + "},\n";
    js += "  \"command\": [";
    for (size_t i = 0; i < o.commands.size(); i++) js += (i ? ", " : "") + json_str(o.commands[i]);
    js += "],\n";
    std::string base = o.model.substr(o.model.find_last_of('/') == std::string::npos ? 0 : o.model.find_last_of('/') + 1);
    if (!o.case_name.empty()) js += "  \"case\": " + json_str(o.case_name) + ",\n";
    if (!o.gen_args.empty()) {
        js += "  \"gen_model_args\": [";
        for (size_t i = 0; i < o.gen_args.size(); i++) js += (i ? ", " : "") + json_str(o.gen_args[i]);
        js += "],\n";
    }
    js += "  \"model\": {\"file\": " + json_str(base) + ", \"sha256\": " + json_str(sha) + ", \"bytes\": " + std::to_string(size) +
          ", \"architecture\": " + json_str(arch) + ", \"desc\": " + json_str(desc) + ", \"n_vocab\": " + std::to_string(n_vocab) + "},\n";
    js += "  \"settings\": {\"device\": \"CPU\", \"threads\": " + std::to_string(o.threads) + ", \"n_ctx\": " + std::to_string(n_ctx) +
          ", \"n_batch\": " + std::to_string(n_ctx) + ", \"n_ubatch\": " + std::to_string(n_ctx) +
          ", \"flash_attn\": false, \"type_k\": " + json_str(o.kv_type) + ", \"type_v\": " + json_str(o.kv_type) + ", \"steps\": " + std::to_string(o.steps) +
          ", \"top\": " + std::to_string(o.top) + ", \"low_margin\": " + num(o.low_margin) +
          ", \"tokenize\": \"llama_tokenize(add_special=true, parse_special=true), as llama-server /tokenize with add_special=true\"" +
          ", \"decode\": \"fresh context per prompt; the whole prompt in one batch, then one token per llama_decode; every step runs, end-of-generation tokens included\"" +
          ", \"greedy\": \"argmax of the raw logits, lowest id on a tie\"" +
          ", \"logprob\": \"natural log of the softmax of the raw float32 logits, computed in float64\"" +
          ", \"margin\": \"p(top1) - p(top2) under that softmax\"" +
          ", \"step\": \"{id, margin, top: [[id, logprob] for the top tokens]}, numbers to 6 significant digits\"},\n";
    js += "  \"prompts\": [\n";

    for (size_t p = 0; p < prompts.size(); p++) {
        const std::vector<llama_token> &ids = prompt_ids[p];
        std::string err;
        std::vector<Step> steps;
        if (ids.empty()) {
            err = "the prompt tokenizes to no tokens (the vocabulary adds no BOS)";
        } else {
            llama_context *ctx = llama_init_from_model(model, cp);
            if (!ctx) {
                fprintf(stderr, "llamacpp_greedy: cannot create a context of %d\n", n_ctx);
                return 1;
            }
            bool ok = decode(ctx, ids, 0);
            int pos = (int)ids.size();
            int last = (int)ids.size() - 1;
            for (int s = 0; ok && s < o.steps; s++) {
                const float *logits = llama_get_logits_ith(ctx, last);
                if (!logits) {
                    ok = false;
                    break;
                }
                steps.push_back(analyse(logits, n_vocab, o.top, vocab));
                if (s + 1 < o.steps) {
                    ok = decode(ctx, {steps.back().id}, pos++);
                    last = 0;
                }
            }
            llama_free(ctx);
            if (!ok) {
                fprintf(stderr, "llamacpp_greedy: prompt %zu: decoding failed\n", p);
                return 1;
            }
        }

        std::vector<llama_token> gen;
        std::string text;
        double min_margin = INFINITY;
        int first_low = -1, first_eog = -1;
        for (size_t s = 0; s < steps.size(); s++) {
            gen.push_back(steps[s].id);
            text += piece(vocab, steps[s].id);
            min_margin = std::min(min_margin, steps[s].margin);
            if (first_low < 0 && steps[s].margin < o.low_margin) first_low = (int)s;
            if (first_eog < 0 && steps[s].eog) first_eog = (int)s;
        }
        js += "    {\"text\": " + json_str(prompts[p]) + ",\n";
        js += "     \"prompt_ids\": " + ids_json(ids) + ",\n";
        if (!err.empty()) {
            js += "     \"error\": " + json_str(err) + "}";
        } else {
            js += "     \"generated_ids\": " + ids_json(gen) + ",\n";
            js += "     \"generated_text\": " + json_str(text) + ",\n";
            js += "     \"min_margin\": " + num(min_margin, "%.6g") + ", \"first_low_margin_step\": " + std::to_string(first_low) +
                  ", \"first_eog_step\": " + std::to_string(first_eog) + ",\n";
            js += "     \"steps\": [\n";
            for (size_t s = 0; s < steps.size(); s++) {
                const Step &st = steps[s];
                // Compact: the test reads the id, the margin and the top
                // ids; the logprobs say how close a divergence was.
                js += "      {\"id\":" + std::to_string(st.id) + ",\"margin\":" + num(st.margin, "%.6g") +
                      (st.eog ? ",\"eog\":true" : "") + ",\"top\":[";
                for (size_t j = 0; j < st.top.size(); j++) {
                    js += std::string(j ? "," : "") + "[" + std::to_string(st.top[j].first) + "," + num(st.logprob[j], "%.6g") + "]";
                }
                js += std::string("]}") + (s + 1 < steps.size() ? "," : "") + "\n";
            }
            js += "     ]}";
        }
        js += p + 1 < prompts.size() ? ",\n" : "\n";
    }
    js += "  ]\n}\n";

    free_model(model);
    llama_backend_free();

    if (o.out.empty()) {
        fwrite(js.data(), 1, js.size(), stdout);
        return 0;
    }
    std::string tmp = o.out + ".tmp";
    FILE *f = fopen(tmp.c_str(), "wb");
    if (!f || fwrite(js.data(), 1, js.size(), f) != js.size() || fclose(f) != 0) {
        fprintf(stderr, "llamacpp_greedy: %s: %s\n", tmp.c_str(), strerror(errno));
        return 1;
    }
    if (rename(tmp.c_str(), o.out.c_str()) != 0) {
        fprintf(stderr, "llamacpp_greedy: %s: %s\n", o.out.c_str(), strerror(errno));
        return 1;
    }
    return 0;
}
