from preshuffle.shapes import ANCHOR_SHAPES, Shape


def test_shape_label():
    assert Shape(256, 2, 65536).label == "B=256 next_n=2 ctx=65536"


def test_anchor_shapes_are_the_specs_eight():
    assert [(s.batch, s.next_n, s.avg_ctx) for s in ANCHOR_SHAPES] == [
        (64, 1, 8192), (64, 2, 8192), (128, 1, 32768), (256, 1, 8192), (4096, 1, 8192), (8, 1, 65536),
        (1, 1, 131072), (256, 2, 65536)]
