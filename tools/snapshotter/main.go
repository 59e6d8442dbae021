// edl-snapshotter: containerd's own overlay snapshotter, served to a real node's containerd as a proxy
// plugin, that takes a layer of edl's images from the machine's one unpacked copy instead of unpacking
// it again (the way lazy-pulling snapshotters such as stargz take a layer they can already serve).
// Test-only: the nodes of edl's plane.
//
//	edl-snapshotter serve SOCKET ROOT LAYERS   serve the snapshots API on SOCKET, snapshots under ROOT
//	edl-snapshotter unpack BLOB DIR            unpack a layer blob into DIR as containerd's overlay differ does
//
// LAYERS holds one directory per layer, named by the layer's digest (sha256-HEX), written by `unpack`.
// When containerd unpacks a pulled image it asks for each layer's snapshot with the layer's digest
// among the labels (the CRI plugin's `containerd.io/snapshot/cri.layer-digest`, sent when
// `disable_snapshot_annotations = false`) and the name to commit it under (`containerd.io/snapshot.ref`).
// If LAYERS has that layer, the snapshot is committed at once with the machine's directory as its
// files, and containerd is told it exists: the layer is neither fetched nor unpacked. Overlay mounts
// only read a committed layer (a container writes to an upper directory of its own), so every node of
// every plane shares the one copy. Any other layer is unpacked into the node's own snapshot as usual.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/archive"
	"github.com/containerd/containerd/archive/compression"
	"github.com/containerd/containerd/contrib/snapshotservice"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/mount"
	"github.com/containerd/containerd/snapshots"
	"github.com/containerd/containerd/snapshots/overlay"
	"google.golang.org/grpc"
)

const (
	refLabel    = "containerd.io/snapshot.ref"
	digestLabel = "containerd.io/snapshot/cri.layer-digest"
)

// sharing is the overlay snapshotter with Prepare taking a layer from the machine's copy when it can.
type sharing struct {
	snapshots.Snapshotter
	layers string
}

func (s *sharing) Prepare(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	var info snapshots.Info
	for _, o := range opts {
		if err := o(&info); err != nil {
			return nil, err
		}
	}
	target, digest := info.Labels[refLabel], info.Labels[digestLabel]
	if target != "" && strings.HasPrefix(digest, "sha256:") {
		dir := filepath.Join(s.layers, strings.Replace(digest, ":", "-", 1))
		if st, err := os.Stat(dir); err == nil && st.IsDir() {
			err := s.link(ctx, key, parent, target, dir, opts)
			if err == nil || errdefs.IsAlreadyExists(err) {
				return nil, fmt.Errorf("layer %s taken from the machine's copy: %w", digest, errdefs.ErrAlreadyExists)
			}
			log.Printf("layer %s: the machine's copy cannot be used (%v); unpacking it", digest, err)
		}
	}
	return s.Snapshotter.Prepare(ctx, key, parent, opts...)
}

// link commits `target` as a snapshot of `parent` whose files are `dir`: an active snapshot is prepared
// as usual, its (empty) files directory replaced by a link to `dir`, and committed.
func (s *sharing) link(ctx context.Context, key, parent, target, dir string, opts []snapshots.Opt) error {
	mounts, err := s.Snapshotter.Prepare(ctx, key, parent, opts...)
	if err != nil {
		return err
	}
	err = func() error {
		files := upperDir(mounts)
		if files == "" {
			return fmt.Errorf("no files directory in the mounts %v", mounts)
		}
		if err := os.Remove(files); err != nil {
			return err
		}
		if err := os.Symlink(dir, files); err != nil {
			return err
		}
		return s.Snapshotter.Commit(ctx, target, key, opts...)
	}()
	if err != nil {
		if rmErr := s.Snapshotter.Remove(ctx, key); rmErr != nil && !errdefs.IsNotFound(rmErr) {
			log.Printf("removing %s: %v", key, rmErr)
		}
	}
	return err
}

// upperDir is the directory an active snapshot's writes go to: a bind mount's source for a snapshot
// without parent, the overlay's upperdir otherwise.
func upperDir(mounts []mount.Mount) string {
	if len(mounts) != 1 {
		return ""
	}
	m := mounts[0]
	if m.Type == "bind" {
		return m.Source
	}
	for _, o := range m.Options {
		if v, ok := strings.CutPrefix(o, "upperdir="); ok {
			return v
		}
	}
	return ""
}

func serve(socket, root, layers string) error {
	sn, err := overlay.NewSnapshotter(root)
	if err != nil {
		return err
	}
	defer sn.Close()
	if err := os.Remove(socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	l, err := net.Listen("unix", socket)
	if err != nil {
		return err
	}
	rpc := grpc.NewServer()
	snapshotsapi.RegisterSnapshotsServer(rpc, snapshotservice.FromSnapshotter(&sharing{Snapshotter: sn, layers: layers}))
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		rpc.GracefulStop()
	}()
	return rpc.Serve(l)
}

// unpack writes the layer `blob` (compressed or not) into `dir` as containerd's overlay differ does:
// owners, modes, times and extended attributes kept, whiteouts made overlay whiteouts.
func unpack(blob, dir string) error {
	f, err := os.Open(blob)
	if err != nil {
		return err
	}
	defer f.Close()
	r, err := compression.DecompressStream(f)
	if err != nil {
		return err
	}
	defer r.Close()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if _, err := archive.Apply(context.Background(), dir, r, archive.WithConvertWhiteout(archive.OverlayConvertWhiteout)); err != nil {
		return err
	}
	// Read to the end: a layer whose archive ends early is an error, not a partial directory.
	_, err = io.Copy(io.Discard, r)
	return err
}

func main() {
	log.SetFlags(log.LstdFlags)
	log.SetPrefix("edl-snapshotter: ")
	var err error
	switch {
	case len(os.Args) == 5 && os.Args[1] == "serve":
		err = serve(os.Args[2], os.Args[3], os.Args[4])
	case len(os.Args) == 4 && os.Args[1] == "unpack":
		err = unpack(os.Args[2], os.Args[3])
	default:
		fmt.Fprintln(os.Stderr, "usage: edl-snapshotter serve SOCKET ROOT LAYERS | unpack BLOB DIR")
		os.Exit(2)
	}
	if err != nil {
		log.Fatal(err)
	}
}
