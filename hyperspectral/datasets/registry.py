"""Metadata of the standard hyperspectral benchmark scenes (GIC, UPV/EHU).

File names, ``.mat`` keys, URLs and class names follow the GIC page
<http://www.ehu.eus/ccwintco/index.php/Hyperspectral_Remote_Sensing_Scenes> and DeepHyperX's
``DATASETS_CONFIG``; sha256 sums are those of ``/work/shared/datasets/SHA256SUMS`` (the files we
hold), ``None`` where no trusted sum is known. Where only the git blob id of the official file is
known (``git hash-object FILE``, from the copies committed in gokriznastic/HybridSN, see
``/work/shared/datasets/README.md``), it is recorded instead and checked the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import DatasetError

__all__ = ["SceneFile", "SceneInfo", "SCENES", "get_scene_info", "scene_names"]


@dataclass(frozen=True)
class SceneFile:
    """One ``.mat`` file of a scene.

    Args:
        filename: name of the file inside the data directory.
        key: MATLAB variable holding the array.
        url: official download address.
        sha256: hex digest of the official file, or ``None`` when unknown.
        git_sha1: git blob id of the official file (``git hash-object``), checked when
            ``sha256`` is unknown; ``None`` when unknown too.
        size: size in bytes of the official file, or ``None`` when unknown.
    """

    filename: str
    key: str
    url: str
    sha256: str | None = None
    git_sha1: str | None = None
    size: int | None = None


@dataclass(frozen=True)
class SceneInfo:
    """Everything needed to find, check and display one scene.

    Args:
        name: registry name (``IndianPines``...).
        cube: the image file (H x W x B).
        gt: the ground-truth file (H x W, 0 = unlabelled, 1..K classes).
        class_names: names of classes 1..K, in label order.
        rgb_bands: zero-based band indices shown as R, G, B.
        shape: expected (H, W, B), informative only.
        citation: where the data comes from.
        tensorly_npy: cube and gt ``.npy`` names inside ``tensorly/datasets/data``, if shipped.
    """

    name: str
    cube: SceneFile
    gt: SceneFile
    class_names: tuple[str, ...]
    rgb_bands: tuple[int, int, int]
    shape: tuple[int, int, int]
    citation: str = ""
    tensorly_npy: tuple[str, str] | None = None

    @property
    def num_classes(self) -> int:
        """Number of labelled classes (label 0 is 'unlabelled' and not counted)."""
        return len(self.class_names)


_GIC = "http://www.ehu.eus/ccwintco/uploads/"
_GIC_ES = "http://www.ehu.es/ccwintco/uploads/"

_AVIRIS_IP = (
    "Alfalfa",
    "Corn-notill",
    "Corn-mintill",
    "Corn",
    "Grass-pasture",
    "Grass-trees",
    "Grass-pasture-mowed",
    "Hay-windrowed",
    "Oats",
    "Soybean-notill",
    "Soybean-mintill",
    "Soybean-clean",
    "Wheat",
    "Woods",
    "Buildings-Grass-Trees-Drives",
    "Stone-Steel-Towers",
)
_PAVIA = (
    "Asphalt",
    "Meadows",
    "Gravel",
    "Trees",
    "Painted metal sheets",
    "Bare Soil",
    "Bitumen",
    "Self-Blocking Bricks",
    "Shadows",
)
_PAVIA_C = (
    "Water",
    "Trees",
    "Asphalt",
    "Self-Blocking Bricks",
    "Bitumen",
    "Tiles",
    "Shadows",
    "Meadows",
    "Bare Soil",
)
_SALINAS = (
    "Brocoli_green_weeds_1",
    "Brocoli_green_weeds_2",
    "Fallow",
    "Fallow_rough_plow",
    "Fallow_smooth",
    "Stubble",
    "Celery",
    "Grapes_untrained",
    "Soil_vinyard_develop",
    "Corn_senesced_green_weeds",
    "Lettuce_romaine_4wk",
    "Lettuce_romaine_5wk",
    "Lettuce_romaine_6wk",
    "Lettuce_romaine_7wk",
    "Vinyard_untrained",
    "Vinyard_vertical_trellis",
)
_KSC = (
    "Scrub",
    "Willow swamp",
    "Cabbage palm hammock",
    "Cabbage palm/oak hammock",
    "Slash pine",
    "Oak/broadleaf hammock",
    "Hardwood swamp",
    "Graminoid marsh",
    "Spartina marsh",
    "Cattail marsh",
    "Salt marsh",
    "Mud flats",
    "Water",
)
_BOTSWANA = (
    "Water",
    "Hippo grass",
    "Floodplain grasses 1",
    "Floodplain grasses 2",
    "Reeds",
    "Riparian",
    "Firescar",
    "Island interior",
    "Acacia woodlands",
    "Acacia shrublands",
    "Acacia grasslands",
    "Short mopane",
    "Mixed mopane",
    "Exposed soils",
)

SCENES: dict[str, SceneInfo] = {
    s.name: s
    for s in (
        SceneInfo(
            name="IndianPines",
            cube=SceneFile(
                "Indian_pines_corrected.mat",
                "indian_pines_corrected",
                _GIC + "6/67/Indian_pines_corrected.mat",
                "ec2f8808710919d566f70f0d4aa885aae1ddfd42b734aba71c5e12ca65450939",
                "75b6d6e7df046fce91eda23e7559e274c92da711",
                5_953_527,
            ),
            gt=SceneFile(
                "Indian_pines_gt.mat",
                "indian_pines_gt",
                _GIC + "c/c4/Indian_pines_gt.mat",
                "65c4687a8ab04f6da4789799bc3bc4f6e88bccac3ed6a2e6ae367e5e6b9e429c",
                "8e308e6d2ad7cbb81dc1cd7849a2b7b768f4be6d",
                1_125,
            ),
            class_names=_AVIRIS_IP,
            rgb_bands=(43, 21, 11),
            shape=(145, 145, 200),
            citation="Baumgardner, Biehl, Landgrebe (2015), Purdue PURR, doi:10.4231/R7RX991C",
            tensorly_npy=("Indian_pines_corrected.npy", "Indian_pines_gt.npy"),
        ),
        SceneInfo(
            name="PaviaU",
            cube=SceneFile(
                "PaviaU.mat",
                "paviaU",
                _GIC + "e/ee/PaviaU.mat",
                git_sha1="6eecc933bedec1130bb046483dd12e25cf091b24",
            ),
            gt=SceneFile(
                "PaviaU_gt.mat",
                "paviaU_gt",
                _GIC + "5/50/PaviaU_gt.mat",
                "23f6a426928f9b32984adffe659e29f554f9fb6c93b5a107528d308d5087a829",
                "85d57a7f2fec6fc2b05a810b31808b88f9357dc6",
                11_005,
            ),
            class_names=_PAVIA,
            rgb_bands=(55, 41, 12),
            shape=(610, 340, 103),
            citation="ROSIS, University of Pavia; GIC UPV/EHU",
        ),
        SceneInfo(
            name="Salinas",
            cube=SceneFile(
                "Salinas_corrected.mat",
                "salinas_corrected",
                _GIC + "a/a3/Salinas_corrected.mat",
                git_sha1="2a745377a77369bd5a9d430c722f0bf5e0d0ffc1",
                size=26_552_770,
            ),
            gt=SceneFile(
                "Salinas_gt.mat",
                "salinas_gt",
                _GIC + "f/fa/Salinas_gt.mat",
                "ecfab4d31ef5553f097943235d8ea502038eb4a2067b2ad10b33e37c949955e2",
                "a0781d95c9fa20bb3c31751a0cf24b7dc09be65b",
                4_277,
            ),
            class_names=_SALINAS,
            rgb_bands=(43, 21, 11),
            shape=(512, 217, 204),
            citation="AVIRIS, Salinas Valley; GIC UPV/EHU",
        ),
        SceneInfo(
            name="PaviaC",
            cube=SceneFile("Pavia.mat", "pavia", _GIC + "e/e3/Pavia.mat"),
            gt=SceneFile("Pavia_gt.mat", "pavia_gt", _GIC + "5/53/Pavia_gt.mat"),
            class_names=_PAVIA_C,
            rgb_bands=(55, 41, 12),
            shape=(1096, 715, 102),
            citation="ROSIS, Pavia Centre; GIC UPV/EHU",
        ),
        SceneInfo(
            name="KSC",
            cube=SceneFile("KSC.mat", "KSC", _GIC_ES + "2/26/KSC.mat"),
            gt=SceneFile("KSC_gt.mat", "KSC_gt", _GIC_ES + "a/a6/KSC_gt.mat"),
            class_names=_KSC,
            rgb_bands=(43, 21, 11),
            shape=(512, 614, 176),
            citation="AVIRIS, Kennedy Space Center; GIC UPV/EHU",
        ),
        SceneInfo(
            name="Botswana",
            cube=SceneFile("Botswana.mat", "Botswana", _GIC_ES + "7/72/Botswana.mat"),
            gt=SceneFile("Botswana_gt.mat", "Botswana_gt", _GIC_ES + "5/58/Botswana_gt.mat"),
            class_names=_BOTSWANA,
            rgb_bands=(75, 33, 15),
            shape=(1476, 256, 145),
            citation="EO-1 Hyperion, Okavango Delta; GIC UPV/EHU",
        ),
    )
}


def scene_names() -> list[str]:
    """Registered scene names, in registry order."""
    return list(SCENES)


def get_scene_info(name: str) -> SceneInfo:
    """Look a scene up by name, case-insensitively.

    Raises:
        DatasetError: the name is not registered; the message lists the valid names.
    """
    for key, info in SCENES.items():
        if key.lower() == name.lower():
            return info
    raise DatasetError(f"unknown scene {name!r}; choose one of {', '.join(SCENES)} or 'synthetic'")
