// Package artifact fetches, verifies, caches and unpacks the files a bake
// needs, and keeps the lock file that pins what the documents leave
// unpinned.
//
// The cache is content-addressed: a blob lives at
// <root>/blobs/sha256/<hex> and only ever appears there by an atomic rename
// of a complete, fsynced temporary file whose sha256 was checked while it
// was written. A partial or wrong download is never visible under a blob
// name, and two fetchers (goroutines or processes) racing for the same blob
// both end up with a correct one. Blobs are verified on insert and trusted
// by name afterwards (they are written read-only); a zero-length blob whose
// name is not the hash of nothing is treated as damaged and fetched again,
// and Cache.Verify re-hashes a blob on demand.
//
// Container images are cached the same way, blob by blob (manifest, config,
// layers, each verified against its digest): Cache.FetchImage pulls an image
// by digest with go-containerregistry and contacts no registry when every blob
// is cached. Registries on the loopback interface are reached over plain HTTP.
// The base image's layers go through the same cache (rootfs.FlattenWith):
// a layer is hashed in full on its way in, before any of its entries is
// applied; from a registry it comes through Cache.FetchRemoteBlob, as the
// pre-pulled images' blobs do. Unpacking one layer or archive is bounded by
// MaxUnpacked.
//
// Downloads over http(s) are retried on transient failures (connection errors, stalls, a
// body cut short, 408, 429, 5xx) with bounded, jittered backoff (DownloadRetry; a 429 or
// 503's Retry-After sets the next pause, capped) and resumed with Range/If-Range; the hash
// still covers the whole file, and a mismatch is never retried. Registry requests use RemoteOptions, built once per command and passed down:
// credentials from the docker config and credential helpers (authn.DefaultKeychain), retries
// on 408, 429 and 5xx (a blob body cut short is fetched again under DownloadRetry), and a
// refusal for want of credentials is an *AuthError that says where they are looked up.
//
// The lock file, images/<name>.lock, is JSON with sorted keys. It records the
// manifest digest of the base image (resolved from a tag through a
// BaseResolver), the linux/amd64 manifest digest of every container image
// whose profile gives none (an imageResolver) and the sha256 of every
// artifact whose profile gives none;
// Pinner writes it (`kiln lock`), and Sources/BaseDigest/Unpinned read it at
// bake time, where anything unpinned is refused.
package artifact
