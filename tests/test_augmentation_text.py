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


def test_image_folders_name_the_native_routes_crop_when_data_native_is_on():
    aug = {"scale": [0.35, 1.0], "ratio": [0.75, 4 / 3], "hflip": 0.5, "re_prob": 0.25}
    square = augmentation_text("imagefolder", {}, aug)
    crops = "random resized crops (area [0.35, 1.0], aspect [0.75, 1.33])"
    assert square == f"{crops} and flips (p=0.5), re_prob=0.25 (timm's transforms)"
    native = augmentation_text("imagefolder", {}, aug, native=True)
    assert native.startswith("random crops (area [0.35, 1.0], aspect the image's own x [0.75, 1.33]) resized to")
    assert native.endswith("and flips (p=0.5), re_prob=0.25")
    assert augmentation_text("fashion-mnist-canvas", {"item": 22}, {}, native=True) == augmentation_text(
        "fashion-mnist-canvas", {"item": 22}, {}
    )  # a dataset without a native wording keeps its one
    timm = "timm's NaFlex crops (area [0.35, 1.0], aspect [0.75, 1.33]) sized to each batch's sequence length and "
    timm += "flips (p=0.5), re_prob=0.25"
    for loader, words in (("visionpe", native), ("timm", timm + " of each image whole")):
        cfg = config_from_dict(dict(data=dict(name="imagefolder", native={"loader": loader}), aug=aug))
        assert recipe_text(cfg).endswith(f"augmentation: {words})")
    # a dataset of normalised tensors: its own augmentation, then timm's crops
    cfg = config_from_dict(dict(data=dict(name="fashion-mnist", options={"crop": "rrc"}, native={"loader": "timm"}),
                                aug=aug))  # fmt: skip
    own = augmentation_text("fashion-mnist", {"crop": "rrc"}, aug)
    assert recipe_text(cfg).endswith(f"augmentation: {own}, then {timm})")


def test_an_aug_option_the_dataset_never_applies_is_an_error_naming_it():
    """timm's colour jitter, auto-augment and erasing run on image folders and timm's readers only: set on another
    dataset they would do nothing, silently, so training refuses them and says what the dataset does instead."""
    import pytest

    from visionpe.data.registry import check_aug_applies

    aug = {"color_jitter": 0.4, "auto_augment": None, "re_prob": 0.25, "hflip": 0.5, "scale": [0.35, 1.0]}
    with pytest.raises(ValueError, match=r"aug.color_jitter=0.4, aug.re_prob=0.25: dataset 'clipart' never") as e:
        check_aug_applies("clipart", aug, {"crop": "rrc"})
    assert "clipart's training augmentation: random resized crops (area [0.35, 1.0]" in str(e.value)
    for name in ("imagefolder", "imagenet", "hfds/some-set"):  # timm's transforms: every option applies
        check_aug_applies(name, aug)
    check_aug_applies("fashion-mnist", {"re_prob": 0.25}, timm_loader=True)  # timm's NaFlex loader erases any item
    check_aug_applies("fashion-mnist", {"color_jitter": 0.0, "auto_augment": None, "re_prob": 0.0})  # all off
