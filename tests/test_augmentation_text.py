"""Reports and model cards say what each dataset's training items went through, from the dataset's own words."""

from visionpe.bench.report import recipe_text
from visionpe.data.registry import augmentation_text
from visionpe.engine.config import config_from_dict


def test_generated_sets_without_augmentation_say_none():
    for name in ("synthetic-shapes", "video-shapes", "image-text-shapes"):
        assert augmentation_text(name, {}, {"scale": [0.08, 1.0], "hflip": 0.5}) == "none"


def test_fashion_mnist_names_the_crop_it_uses():
    rrc = augmentation_text(
        "fashion-mnist", {"crop": "rrc"}, {"scale": [0.5, 1.0], "ratio": [0.75, 4 / 3], "hflip": 0.5}
    )
    assert rrc == "random resized crops (area [0.5, 1.0], aspect [0.75, 1.33]) and flips (p=0.5)"
    assert augmentation_text("fashion-mnist", {"shift": 3}, {"hflip": 0.0}) == "random shifts of up to 3 px"
    assert augmentation_text("fashion-mnist", {"augment": False}, {"hflip": 0.5}) == "none"
    canvas = augmentation_text("fashion-mnist-canvas", {"item": 22}, {"hflip": 0.0})
    assert canvas == "the garment at a random position on the canvas"


def test_reports_and_cards_state_the_augmentation_not_the_unused_settings():
    cfg = config_from_dict(dict(data=dict(name="video-shapes", options={"frames": 8}), aug=dict(hflip=0.5),
                                train=dict(epochs=2)))  # fmt: skip
    text = recipe_text(cfg)
    assert "hflip" not in text and text.endswith("data options: frames=8; augmentation: none)")
