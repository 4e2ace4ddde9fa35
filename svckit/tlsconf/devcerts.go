package tlsconf

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// CA file names in a directory WriteDevCerts writes; each role's pair is
// <role>.crt and <role>.key.
const (
	CACertFile = "ca.crt"
	CAKeyFile  = "ca.key"
)

// DevOptions configure WriteDevCerts.
type DevOptions struct {
	// Hosts are DNS names or IP addresses added to every certificate's
	// SANs, besides localhost, 127.0.0.1 and ::1.
	Hosts []string
	// Validity is how long the certificates are valid (default 1 year).
	Validity time.Duration
}

// FilesIn are role's files in a directory WriteDevCerts wrote.
func FilesIn(dir string, role Role) Files {
	return Files{Cert: filepath.Join(dir, string(role)+".crt"), Key: filepath.Join(dir, string(role)+".key"),
		CA: filepath.Join(dir, CACertFile)}
}

// WriteDevCerts writes a development CA (ca.crt, ca.key) and a certificate
// and key for each role (router.crt, router.key, ...) into dir, creating
// it. Keys are ECDSA P-256, written 0600. Each role certificate names its
// role as spiffe://baton/<role> and is valid for both TLS server and client
// use. Existing files are overwritten.
func WriteDevCerts(dir string, o DevOptions) error {
	if o.Validity == 0 {
		o.Validity = 365 * 24 * time.Hour
	}
	if o.Validity < 0 {
		return errors.New("validity must be positive")
	}
	var dns []string
	ips := []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	for _, h := range append([]string{"localhost"}, o.Hosts...) {
		if ip := net.ParseIP(h); ip != nil {
			ips = append(ips, ip)
		} else if h != "" {
			dns = append(dns, h)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	now := time.Now().Add(-time.Minute) // tolerate small clock skew
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{Organization: []string{"Baton"}, CommonName: "Baton development CA"},
		NotBefore:             now,
		NotAfter:              now.Add(o.Validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	if err := writePair(dir, "ca", caDER, caKey); err != nil {
		return err
	}
	for _, r := range Roles {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{
			SerialNumber: serial(),
			Subject:      pkix.Name{Organization: []string{"Baton"}, OrganizationalUnit: []string{string(r)}, CommonName: "baton-" + string(r)},
			NotBefore:    now,
			NotAfter:     now.Add(o.Validity),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
			DNSNames:     dns,
			IPAddresses:  ips,
			URIs:         []*url.URL{r.URI()},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		if err := writePair(dir, string(r), der, key); err != nil {
			return err
		}
	}
	return nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return n
}

func writePair(dir, name string, der []byte, key *ecdsa.PrivateKey) error {
	kd, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := writeFile(filepath.Join(dir, name+".crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return err
	}
	return writeFile(filepath.Join(dir, name+".key"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kd}), 0o600)
}

// writeFile replaces path atomically (a running service re-reading it sees
// the old or the new file, never half of one).
func writeFile(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
