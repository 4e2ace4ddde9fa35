package openai

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Keys is a set of API keys. Clients present one as "Authorization: Bearer
// KEY" over HTTP and as the "authorization" metadata over gRPC. Only the
// keys' SHA-256 digests are kept, and a presented key is compared with every
// digest in constant time, so neither the comparison's timing nor a memory
// dump gives a key away. A nil *Keys accepts every request.
type Keys struct {
	digests [][sha256.Size]byte
}

// LoadKeys reads an API keys file: one key per line; blank lines and lines
// starting with '#' are skipped; surrounding spaces are trimmed. A file with
// no key is an error (an empty file would otherwise lock every client out
// silently). Errors never quote a key.
func LoadKeys(path string) (*Keys, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	k := &Keys{}
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		key := strings.TrimSpace(sc.Text())
		if key == "" || strings.HasPrefix(key, "#") {
			continue
		}
		if strings.ContainsAny(key, " \t") {
			return nil, fmt.Errorf("%s:%d: a key may not contain spaces", path, line)
		}
		k.digests = append(k.digests, sha256.Sum256([]byte(key)))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(k.digests) == 0 {
		return nil, fmt.Errorf("%s: no API keys", path)
	}
	return k, nil
}

// NewKeys makes a key set from keys in memory (tests, embedding).
func NewKeys(keys ...string) (*Keys, error) {
	k := &Keys{}
	for i, key := range keys {
		if key == "" || strings.ContainsAny(key, " \t\r\n") {
			return nil, fmt.Errorf("key %d: empty or contains spaces", i)
		}
		k.digests = append(k.digests, sha256.Sum256([]byte(key)))
	}
	if len(k.digests) == 0 {
		return nil, errors.New("no API keys")
	}
	return k, nil
}

// With returns a copy of k that also accepts key. The router adds its
// self-probe's key, which exists only in its memory, so that the probe
// passes authentication as a client would. k must not be nil: a nil *Keys
// (authentication off) needs no key.
func (k *Keys) With(key string) (*Keys, error) {
	if key == "" || strings.ContainsAny(key, " \t\r\n") {
		return nil, errors.New("key empty or contains spaces")
	}
	out := &Keys{digests: append([][sha256.Size]byte(nil), k.digests...)}
	out.digests = append(out.digests, sha256.Sum256([]byte(key)))
	return out, nil
}

// String says how many keys there are, never what they are.
func (k *Keys) String() string {
	if k == nil {
		return "no API keys (authentication off)"
	}
	return fmt.Sprintf("%d API keys", len(k.digests))
}

// Len is the number of keys.
func (k *Keys) Len() int {
	if k == nil {
		return 0
	}
	return len(k.digests)
}

// valid reports whether key is one of k's, looking at every digest whatever
// matches, so the time taken does not depend on which key matched.
func (k *Keys) valid(key string) bool {
	d := sha256.Sum256([]byte(key))
	match := 0
	for i := range k.digests {
		match |= subtle.ConstantTimeCompare(d[:], k.digests[i][:])
	}
	return match == 1
}

// Authorized reports whether an Authorization value ("Bearer KEY") carries
// a valid key. A nil *Keys authorizes everything.
func (k *Keys) Authorized(authorization string) bool {
	if k == nil {
		return true
	}
	scheme, key, ok := strings.Cut(strings.TrimSpace(authorization), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	return k.valid(strings.TrimSpace(key))
}

const errUnauthenticated = "missing or invalid API key: send \"Authorization: Bearer <key>\""

// KeyID identifies the API key that made a call: its SHA-256 digest. The
// router records it with each request so that only the same key can abort
// it.
type KeyID [sha256.Size]byte

type keyIDCtx struct{}

// CallerKey returns the key that authorized the call of ctx; ok is false
// when authentication is off (or ctx did not pass Keys).
func CallerKey(ctx context.Context) (id KeyID, ok bool) {
	id, ok = ctx.Value(keyIDCtx{}).(KeyID)
	return id, ok
}

// withCaller records the key in authorization ("Bearer KEY") as ctx's
// caller.
func withCaller(ctx context.Context, authorization string) context.Context {
	_, key, _ := strings.Cut(strings.TrimSpace(authorization), " ")
	return context.WithValue(ctx, keyIDCtx{}, KeyID(sha256.Sum256([]byte(strings.TrimSpace(key)))))
}

// Middleware answers 401 in OpenAI's shape for requests without a valid key
// and passes the others to next, their context naming the key
// (CallerKey).
func (k *Keys) Middleware(next http.Handler) http.Handler {
	if k == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, v := range r.Header.Values("Authorization") {
			if k.Authorized(v) {
				next.ServeHTTP(w, r.WithContext(withCaller(r.Context(), v)))
				return
			}
		}
		(&httpError{status: http.StatusUnauthorized, typ: typeInvalidRequest, code: "invalid_api_key", message: errUnauthenticated}).write(w, r)
	})
}

// check authorizes a gRPC call by its "authorization" metadata and returns
// its context naming the key (CallerKey).
func (k *Keys) check(ctx context.Context) (context.Context, error) {
	if k == nil {
		return ctx, nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		if k.Authorized(v) {
			return withCaller(ctx, v), nil
		}
	}
	return ctx, status.Error(codes.Unauthenticated, errUnauthenticated)
}

// UnaryInterceptor refuses unary calls without a valid key (UNAUTHENTICATED).
func (k *Keys) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		ctx, err := k.check(ctx)
		if err != nil {
			return nil, err
		}
		return h(ctx, req)
	}
}

// StreamInterceptor refuses streaming calls without a valid key
// (UNAUTHENTICATED).
func (k *Keys) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		ctx, err := k.check(ss.Context())
		if err != nil {
			return err
		}
		return h(srv, callerStream{ss, ctx})
	}
}

// callerStream is a server stream whose context names its caller's key.
type callerStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s callerStream) Context() context.Context { return s.ctx }

// Guard returns a copy of desc whose every method first runs k's
// interceptors, for registering one service behind authentication with
// grpc.Server.RegisterService while health checks and reflection on the same
// server stay open. A nil *Keys returns desc itself.
func (k *Keys) Guard(desc *grpc.ServiceDesc) *grpc.ServiceDesc {
	if k == nil {
		return desc
	}
	unary, stream := k.UnaryInterceptor(), k.StreamInterceptor()
	out := *desc
	out.Methods = make([]grpc.MethodDesc, len(desc.Methods))
	for i, m := range desc.Methods {
		orig := m.Handler
		m.Handler = func(srv any, ctx context.Context, dec func(any) error, next grpc.UnaryServerInterceptor) (any, error) {
			// The generated handler decodes the request, then calls the
			// interceptor it is given; chain ours in front of the server's.
			chained := unary
			if next != nil {
				chained = func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
					return unary(ctx, req, info, func(ctx context.Context, req any) (any, error) {
						return next(ctx, req, info, h)
					})
				}
			}
			return orig(srv, ctx, dec, chained)
		}
		out.Methods[i] = m
	}
	out.Streams = make([]grpc.StreamDesc, len(desc.Streams))
	for i, s := range desc.Streams {
		orig := s.Handler
		info := &grpc.StreamServerInfo{FullMethod: "/" + desc.ServiceName + "/" + s.StreamName,
			IsClientStream: s.ClientStreams, IsServerStream: s.ServerStreams}
		s.Handler = func(srv any, ss grpc.ServerStream) error {
			return stream(srv, ss, info, orig)
		}
		out.Streams[i] = s
	}
	return &out
}
