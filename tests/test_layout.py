import pytest
import torch

from visionpe.layout.tokens import TokenLayout, cell_centre_layout, image_layout, video_layout


def test_image_layout_uses_raw_indices_x_fastest_on_rectangular_grid():
    lay = image_layout(3, 5, num_prefix=1)
    assert lay.grid == (1, 3, 5) and lay.num_prefix == 1 and lay.num_tokens == 16
    i = torch.arange(15)
    assert torch.equal(lay.pos[:, 0], (i % 5).float())  # x = i % W
    assert torch.equal(lay.pos[:, 1], (i // 5).float())  # y = i // W
    assert lay.hw == (3, 5)


def test_layouts_are_cached_by_shape():
    assert image_layout(4, 4).pos is image_layout(4, 4, num_prefix=2).pos
    assert image_layout(4, 4).pos is not image_layout(4, 5).pos


def test_video_layout_streams_are_t_y_x():
    lay = video_layout(2, 3, 4)
    assert lay.pos.shape == (24, 3)
    n = 12 + 4 + 3  # t=1, y=1, x=3 in raster order
    assert lay.pos[n].tolist() == [1.0, 1.0, 3.0]


def test_cell_centre_layout_is_in_query_grid_units():
    lay = cell_centre_layout(2, 3, stride=2)
    assert lay.pos[:, 0].tolist() == [0.5, 2.5, 4.5] * 2
    assert lay.pos[:, 1].tolist() == [0.5] * 3 + [2.5] * 3


def test_layout_rejects_inconsistent_grid():
    with pytest.raises(ValueError, match="does not match"):
        TokenLayout(0, (1, 2, 2), torch.zeros(5, 2))
    with pytest.raises(ValueError, match="at least"):
        image_layout(0, 3)
