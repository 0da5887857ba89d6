package bake

import (
	"time"

	"github.com/kilnproject/kiln/builder/artifact"
)

// fetch brings the profile's artifacts and, unless they are left out, its pre-pulled images
// into the cache, each verified against its pin. It returns the artifacts' cached blobs and the
// images, both in the profile's order.
func (b *baker) fetch() (blobs []string, images []*artifact.CachedImage, err error) {
	t := time.Now()
	if blobs, err = b.fetchArtifacts(); err != nil {
		return nil, nil, err
	}
	b.step("artifacts fetched", t)

	t = time.Now()
	if images, err = b.fetchImages(); err != nil {
		return nil, nil, err
	}
	if len(images) > 0 {
		b.step("images fetched", t)
	}
	return blobs, images, nil
}

func (b *baker) fetchArtifacts() ([]string, error) {
	srcs, err := artifact.Sources(b.prof, b.lock)
	if err != nil {
		return nil, err
	}
	paths := make([]string, len(srcs))
	for i, s := range srcs {
		p, err := b.o.Cache.Fetch(b.ctx, s)
		if err != nil {
			return nil, err
		}
		paths[i] = p
	}
	return paths, nil
}

func (b *baker) fetchImages() ([]*artifact.CachedImage, error) {
	if b.o.WithoutImages {
		return nil, nil
	}
	srcs, err := artifact.ImageSources(b.prof, b.lock)
	if err != nil {
		return nil, err
	}
	out := make([]*artifact.CachedImage, 0, len(srcs))
	for _, s := range srcs {
		ci, err := b.o.Cache.FetchImage(b.ctx, s, b.o.ImageFetch)
		if err != nil {
			return nil, err
		}
		out = append(out, ci)
	}
	return out, nil
}
