/* kiln/tokenizer.h — Hugging Face tokenizer.json, in C.
 *
 * A `struct kiln_tokenizer` is loaded once from a model folder (tokenizer.json,
 * plus tokenizer_config.json when present) or from a tokenizer.json buffer, and
 * is then read-only: encode, decode and the lookups may be called from several
 * threads at once. It reproduces the `tokenizers` library (0.2x) exactly for
 * BPE models — byte-level (GPT-2, Qwen, Llama-3, DeepSeek, gpt-oss) and
 * SentencePiece style with byte fallback (Llama-2, Gemma) — with their
 * normalizers, pre-tokenizers, added tokens, post-processors and decoders. A
 * component it does not implement makes loading fail with a message naming
 * the component, never a silent approximation.
 *
 * Errors: functions that can fail return 0 or -1 and fill a caller-owned
 * `struct kiln_error` (see src/base/error.h; `msg` holds the text). A NULL
 * error pointer is allowed.
 *
 * Streaming: `struct kiln_detok_stream` turns ids into text one id at a time,
 * returning only text that later ids can no longer change; the concatenation
 * of everything it returns, plus `kiln_detok_stream_flush`, is exactly
 * `kiln_tokenizer_decode` of all ids.
 *
 *     struct kiln_tokenizer *tok;
 *     if (kiln_tokenizer_load(&tok, "models/qwen3", &err)) ...;
 *     struct kiln_token_ids ids = {0};
 *     kiln_tokenizer_encode(tok, text, strlen(text), 1, &ids, &err);
 *     ...
 *     kiln_token_ids_free(&ids);
 *     kiln_tokenizer_free(tok);
 */
#ifndef KILN_TOKENIZER_H
#define KILN_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct kiln_error;
struct kiln_tokenizer;
struct kiln_detok_stream;

/* A growable id array; encode resets `n` and reuses the storage. */
struct kiln_token_ids {
    int32_t *ids;
    size_t n;
    size_t cap;
};
void kiln_token_ids_free(struct kiln_token_ids *v);

/* `path` is a folder holding tokenizer.json (and optionally
 * tokenizer_config.json) or the path of a tokenizer.json file. */
int kiln_tokenizer_load(struct kiln_tokenizer **out, const char *path, struct kiln_error *err);
/* From memory; `config` (tokenizer_config.json contents) may be NULL. */
int kiln_tokenizer_load_buffer(struct kiln_tokenizer **out, const char *json, size_t json_len,
                               const char *config, size_t config_len, struct kiln_error *err);
void kiln_tokenizer_free(struct kiln_tokenizer *tok);

/* Text (UTF-8, `len` bytes, need not be NUL-terminated) to ids. With
 * `add_special_tokens` the tokenizer.json post-processor adds its tokens
 * (BOS etc.) exactly as `Tokenizer.encode(text, add_special_tokens=True)`;
 * tokenizer_config.json's add_bos_token is reported by
 * kiln_tokenizer_add_bos_token but not applied here. The "truncation" and
 * "padding" settings of tokenizer.json are not applied either (transformers
 * also turns them off unless a call asks for them): the ids are never cut
 * or padded. Fails on invalid UTF-8. */
int kiln_tokenizer_encode(const struct kiln_tokenizer *tok, const char *text, size_t len,
                          int add_special_tokens, struct kiln_token_ids *out, struct kiln_error *err);

/* Ids to text, as `Tokenizer.decode(ids, skip_special_tokens)`: ids unknown to
 * the vocabulary are dropped. `*out` is malloc'd and NUL-terminated. */
int kiln_tokenizer_decode(const struct kiln_tokenizer *tok, const int32_t *ids, size_t n,
                          int skip_special_tokens, char **out, size_t *out_len, struct kiln_error *err);

/* -1 when the token is not in the vocabulary (added tokens included). */
int32_t kiln_tokenizer_token_to_id(const struct kiln_tokenizer *tok, const char *token, size_t len);
/* The token's text (NUL-terminated, owned by the tokenizer), NULL if none. */
const char *kiln_tokenizer_id_to_token(const struct kiln_tokenizer *tok, int32_t id, size_t *len);
/* Number of distinct tokens, added tokens included (HF get_vocab_size(True)). */
size_t kiln_tokenizer_vocab_size(const struct kiln_tokenizer *tok);
/* One more than the largest id in use: the size an id-indexed table needs. */
int32_t kiln_tokenizer_id_limit(const struct kiln_tokenizer *tok);
/* Special ids, -1 when the tokenizer has none. From tokenizer_config.json
 * (bos_token / eos_token) when present. */
int32_t kiln_tokenizer_bos_id(const struct kiln_tokenizer *tok);
int32_t kiln_tokenizer_eos_id(const struct kiln_tokenizer *tok);
/* tokenizer_config.json add_bos_token / add_eos_token (0 when absent). */
int kiln_tokenizer_add_bos_token(const struct kiln_tokenizer *tok);
int kiln_tokenizer_add_eos_token(const struct kiln_tokenizer *tok);
/* Whether decode with skip_special_tokens drops this id. */
int kiln_tokenizer_is_special(const struct kiln_tokenizer *tok, int32_t id);

/* Every id's raw bytes: what the token stands for inside a generated text,
 * for grammar-constrained decoding (a grammar matches bytes). Byte-level
 * BPE tokens go through GPT-2's byte map (a token may be part of a UTF-8
 * sequence), SentencePiece's U+2581 is a space, "<0xNN>" byte-fallback
 * tokens are that byte, added tokens are their content; special tokens are
 * flagged. Indexed by id up to kiln_tokenizer_id_limit; ids without a
 * token have bytes NULL. Decoding a sequence of ids gives the
 * concatenation of their bytes wherever that is valid UTF-8 (and the
 * decoder strips nothing at the start of the text). */
struct kiln_token_bytes {
    int32_t n;            /* ids covered: kiln_tokenizer_id_limit */
    const char **bytes;   /* [n] into data; NULL for unused ids */
    size_t *lens;         /* [n] */
    uint8_t *special;     /* [n] 1: a special added token */
    char *data;           /* the bytes of all tokens */
};
int kiln_tokenizer_token_bytes(const struct kiln_tokenizer *tok, struct kiln_token_bytes *out,
                               struct kiln_error *err);
void kiln_token_bytes_free(struct kiln_token_bytes *v);

/* Incremental detokenization of one sequence. */
int kiln_detok_stream_init(struct kiln_detok_stream **out, const struct kiln_tokenizer *tok,
                           int skip_special_tokens);
void kiln_detok_stream_free(struct kiln_detok_stream *s);
/* Feeds ids that come before the sequence (the prompt's last few, for a
 * completion) as context: their text is not returned, but the ids after
 * them decode as they do after that context — SentencePiece's leading
 * space of the first output token survives instead of being stripped as
 * the start of a text. Call before the first push. When the context would
 * leave text held back (it ends inside a character), it is dropped and the
 * stream starts fresh, as without context. */
int kiln_detok_stream_prime(struct kiln_detok_stream *s, const int32_t *ids, size_t n);
/* Feeds one id; `*text`/`*len` receive the newly final text (maybe empty),
 * valid UTF-8, valid until the next call on this stream. */
int kiln_detok_stream_push(struct kiln_detok_stream *s, int32_t id, const char **text, size_t *len);
/* Ends the sequence and returns the held-back rest. The stream can then be
 * reused for a new sequence. */
int kiln_detok_stream_flush(struct kiln_detok_stream *s, const char **text, size_t *len);

#ifdef __cplusplus
}
#endif
#endif
