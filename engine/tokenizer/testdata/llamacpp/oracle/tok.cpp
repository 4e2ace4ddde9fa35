// Oracle for Baton's tokenizer tests: tokenizes each case of an .inp file
// with llama.cpp (add_special=false; parse_special=false, or true when a
// third argument "special" is given) and prints one line of ids per case,
// in the format of llama.cpp's models/ggml-vocab-*.gguf.out files.
#include "llama.h"
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>
#include <iterator>
static void quiet(ggml_log_level, const char *, void *) {}
int main(int argc, char ** argv) {
    if (argc < 3) { fprintf(stderr, "usage: tok VOCAB INP [special]\n"); return 2; }
    const bool parse_special = argc > 3 && std::string(argv[3]) == "special";
    llama_log_set(quiet, nullptr);
    llama_backend_init();
    auto mp = llama_model_default_params();
    mp.vocab_only = true;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "load failed\n"); return 1; }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    std::ifstream in(argv[2], std::ios::binary);
    std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string sep = "\n__ggml_vocab_test__\n";
    size_t pos = 0;
    while (pos < raw.size()) {
        size_t next = raw.find(sep, pos);
        std::string s = next == std::string::npos ? raw.substr(pos) : raw.substr(pos, next - pos);
        std::vector<llama_token> toks(s.size() + 16);
        int n = llama_tokenize(vocab, s.data(), s.size(), toks.data(), toks.size(), false, parse_special);
        if (n < 0) { toks.resize(-n); n = llama_tokenize(vocab, s.data(), s.size(), toks.data(), toks.size(), false, parse_special); }
        for (int i = 0; i < n; i++) printf(" %d", toks[i]);
        printf("\n");
        if (next == std::string::npos) break;
        pos = next + sep.size();
    }
    llama_model_free(model);
    return 0;
}
