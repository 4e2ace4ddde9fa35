// Package modelfile turns the value of Baton's --model flag into the path of
// a GGUF file on local disk, downloading it from the Hugging Face hub when
// needed.
//
// A reference is either a local path, which must name a readable regular
// file, or
//
//	hf://OWNER/REPO/path/in/repo/FILE.gguf
//	hf://OWNER/REPO@REVISION/path/in/repo/FILE.gguf
//
// where REVISION (a branch, tag or commit hash; default "main") is a single
// path segment. The file is fetched from
// {BaseURL}/{OWNER}/{REPO}/resolve/{REVISION}/{path} with BaseURL defaulting
// to $BATON_HF_ENDPOINT, else https://huggingface.co, and an
// "Authorization: Bearer" header when Options.Token or $HF_TOKEN is set.
//
// # Cache layout
//
// Downloads live under the cache directory (Options.CacheDir, else
// $BATON_CACHE_DIR, else os.UserCacheDir()/baton/models):
//
//	<cache>/hf/<OWNER>/<REPO>/<REVISION>/<path/in/repo>/FILE.gguf          the model, present only when complete
//	<cache>/hf/<OWNER>/<REPO>/<REVISION>/<path/in/repo>/FILE.gguf.sha256   its sha256, in sha256sum format
//	<cache>/hf/<OWNER>/<REPO>/<REVISION>/<path/in/repo>/FILE.gguf.partial  a download in progress or interrupted
//	<cache>/hf/<OWNER>/<REPO>/<REVISION>/<path/in/repo>/FILE.gguf.partial.meta  what the partial belongs to (size, sha256)
//	<cache>/hf/<OWNER>/<REPO>/<REVISION>/<path/in/repo>/FILE.gguf.lock     held while a process downloads
//
// FILE.gguf appears only by an atomic rename once every byte has arrived and
// the sha256 matched the one the hub announced (X-Linked-Etag or ETag), so a
// file at that path is always whole. Once it exists, Resolve returns it
// without any network access; a mutable revision such as "main" is therefore
// pinned to whatever it was at the first download — delete the directory, or
// name a commit, to get another version.
//
// An interrupted download leaves FILE.gguf.partial behind; the next Resolve
// resumes it with an HTTP Range request, or starts over when the server does
// not support ranges or the remote file changed. The lock is an flock on
// FILE.gguf.lock, which stays in place after use because deleting it while
// another process waits on it would let two downloads run at once; systems
// without flock use an O_EXCL lock file instead, refreshed while held and
// broken when stale. Short-lived *.tmp files appear while the small
// records are rewritten.
package modelfile
