package realnode

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"time"
)

// keyPair is a certificate and its key, parsed and in PEM.
type keyPair struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte
	keyPEM  []byte
}

// certLife bounds every certificate: a node lives for one test run.
const certLife = 24 * time.Hour

// newCA returns a self-signed certificate authority.
func newCA(name string) (*keyPair, error) {
	return sign(nil, &x509.Certificate{
		Subject:               pkix.Name{CommonName: name},
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	})
}

// serving returns a serving certificate for names (IP addresses or DNS names) signed by kp.
func (kp *keyPair) serving(names ...string) (*keyPair, error) {
	t := &x509.Certificate{
		Subject:     pkix.Name{CommonName: names[0]},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			t.IPAddresses = append(t.IPAddresses, ip)
		} else {
			t.DNSNames = append(t.DNSNames, n)
		}
	}
	return sign(kp, t)
}

// client returns a client certificate for user in groups, signed by kp: the API server
// authenticates it as that user.
func (kp *keyPair) client(user string, groups ...string) (*keyPair, error) {
	return sign(kp, &x509.Certificate{
		Subject:     pkix.Name{CommonName: user, Organization: groups},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

// sign fills t's serial and validity, makes a key, and signs t with parent (nil: itself).
func sign(parent *keyPair, t *x509.Certificate) (*keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("failed to generate a key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, fmt.Errorf("failed to generate a serial number: %w", err)
	}
	t.SerialNumber = serial
	t.NotBefore = time.Now().Add(-time.Minute)
	t.NotAfter = t.NotBefore.Add(certLife)
	issuer, signer := t, key
	if parent != nil {
		issuer, signer = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, t, issuer, &key.PublicKey, signer)
	if err != nil {
		return nil, fmt.Errorf("failed to sign the certificate of %q: %w", t.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("failed to parse the certificate of %q: %w", t.Subject.CommonName, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("failed to marshal the key of %q: %w", t.Subject.CommonName, err)
	}
	return &keyPair{
		cert:    cert,
		key:     key,
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

// publicPEM is the PEM of kp's public key (the API server verifies service account tokens with it).
func (kp *keyPair) publicPEM() ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(&kp.key.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("failed to marshal a public key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), nil
}
