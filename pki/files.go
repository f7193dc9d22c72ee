package pki

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/geolog/geolog/vfs"
)

// The files of a certs folder (as `geolog certs` writes them and geologd
// and the CLI read them with --certs-dir).
const (
	CACertFile     = "ca.crt"
	CAKeyFile      = "ca.key"
	NodeCertFile   = "node.crt"
	NodeKeyFile    = "node.key"
	ClientCertFile = "client.crt"
	ClientKeyFile  = "client.key"
	ServerCertFile = "server.crt"
	ServerKeyFile  = "server.key"
)

// fileMode is the mode of every file this package writes, certificates
// included (a certs folder is one node's or one principal's).
const fileMode = 0o600

// dirMode is the mode of the certs folders it creates.
const dirMode = 0o700

// ErrExists: a file to be written exists and overwriting was not asked for.
var ErrExists = errors.New("pki: file exists (pass --overwrite to replace it)")

// WritePair writes p's certificate to certPath and key to keyPath, each
// atomically and mode 0600, creating their folders (0700). Without
// overwrite it refuses, writing nothing, when either file exists. The key
// is written first: a reader that polls the pair sees the new key with the
// old certificate for a moment, a mismatch it refuses, never a half file.
func WritePair(certPath, keyPath string, p Pair, overwrite bool) error {
	if !overwrite {
		for _, path := range []string{certPath, keyPath} {
			if _, err := os.Lstat(path); err == nil {
				return fmt.Errorf("%w: %s", ErrExists, path)
			} else if !errors.Is(err, fs.ErrNotExist) {
				return err
			}
		}
	}
	for _, w := range []struct {
		path string
		data []byte
	}{{keyPath, p.KeyPEM}, {certPath, p.CertPEM}} {
		if err := os.MkdirAll(filepath.Dir(w.path), dirMode); err != nil {
			return err
		}
		if err := vfs.WriteFileAtomic(vfs.OS(), w.path, w.data, fileMode); err != nil {
			return err
		}
	}
	return nil
}

// WriteCACopy puts the CA certificate caPEM at path (mode 0600), where a
// node or client certs folder keeps it. A file there with the same content
// is left alone; one with other content is replaced only with overwrite.
func WriteCACopy(path string, caPEM []byte, overwrite bool) error {
	old, err := os.ReadFile(path)
	switch {
	case err == nil && bytes.Equal(old, caPEM):
		return nil
	case err == nil && !overwrite:
		return fmt.Errorf("%w: %s holds another CA certificate", ErrExists, path)
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), dirMode); err != nil {
		return err
	}
	return vfs.WriteFileAtomic(vfs.OS(), path, caPEM, fileMode)
}

// LoadAuthority reads a CA's certificate and key files.
func LoadAuthority(certPath, keyPath string) (*Authority, error) {
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, fmt.Errorf("pki: CA certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("pki: CA key: %w", err)
	}
	return ParseAuthority(certPEM, keyPEM)
}
