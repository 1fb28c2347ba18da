//! Answers, for each job, whether Hypha's Rust side would accept it as JOB_JSON.
//!
//! stdin: one job per line, hex-encoded bytes (so that any bytes, newlines and invalid
//! UTF-8 included, travel). stdout: one line per job, `accept` or `refuse<TAB>reason`.
//! The one argument names the generation whose types judge: `alpha17` (the default) or
//! `actions` (module `actions` below).
//!
//! The types below restate Hypha's `JobSpec` (crates/messages, snapshot 2025-11-21): the
//! same field names, Rust types, serde attributes and `try_from` checks, so that serde,
//! serde_json and uuid decide as they do in the worker. A job reaches the worker's child
//! as an environment variable, which Rust reads as a `String`: bytes that are not UTF-8
//! are refused before serde sees them.

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use std::fmt;
use std::io::{self, BufRead, Write};

#[allow(dead_code)]
#[derive(Deserialize)]
struct JobSpec {
    job_id: uuid::Uuid,
    executor: Executor,
}

#[allow(dead_code)]
#[derive(Deserialize)]
#[serde(tag = "class", rename_all = "kebab-case")]
enum Executor {
    Train(TrainExecutor),
    Aggregate(AggregateExecutor),
}

#[allow(dead_code)]
#[derive(Deserialize)]
struct TrainExecutor {
    descriptor: Descriptor,
    config: TrainConfig,
}

#[allow(dead_code)]
#[derive(Deserialize)]
struct AggregateExecutor {
    descriptor: Descriptor,
    config: AggregateConfig,
}

#[allow(dead_code)]
#[derive(Deserialize)]
struct Descriptor {
    name: String,
}

#[allow(dead_code)]
#[derive(Deserialize)]
struct TrainConfig {
    model: Model,
    data: Fetch,
    updates: Send,
    results: Receive,
    optimizer: Adam,
    batch_size: u32,
    preprocessor: Option<Preprocessor>,
    scheduler: Option<Scheduler>,
}

#[allow(dead_code)]
#[derive(Deserialize)]
struct AggregateConfig {
    updates: Receive,
    results: Send,
    optimizer: Nesterov,
}

#[allow(dead_code)]
#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Model {
    task: ModelType,
    artifact: Fetch,
    input_names: Vec<String>,
}

#[allow(dead_code)]
#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Preprocessor {
    task: PreprocessorType,
    artifact: Fetch,
    input_names: Vec<String>,
}

#[allow(dead_code)]
#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Adam {
    learning_rate: f64,
    betas: Option<[f64; 2]>,
    epsilon: Option<f64>,
}

#[allow(dead_code)]
#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Nesterov {
    learning_rate: f64,
    momentum: f64,
}

#[allow(dead_code)]
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
enum Scheduler {
    CosineWithWarmup { warmup_steps: i32, training_steps: i32 },
    LinearWithWarmup { warmup_steps: i32, training_steps: i32 },
    Wsd { warmup_steps: i32, decay_steps: i32 },
}

#[allow(dead_code)]
#[derive(Deserialize)]
#[serde(tag = "type")]
enum Reference {
    #[serde(rename = "uri")]
    Uri { value: String },
    #[serde(rename = "huggingface")]
    HuggingFace {
        repository: String,
        revision: Option<String>,
        filenames: Vec<String>,
        token: Option<String>,
    },
    #[serde(rename = "peers")]
    Peers {
        peers: Vec<PeerId>,
        strategy: Strategy,
        resource: Option<DataSlice>,
    },
    #[serde(rename = "scheduler")]
    Scheduler { peer: PeerId, dataset: String },
}

#[derive(Deserialize)]
#[serde(tag = "type")]
enum Strategy {
    All,
    Random,
    One,
}

#[allow(dead_code)]
#[derive(Deserialize)]
struct DataSlice {
    dataset: String,
    index: u64,
}

#[allow(dead_code)]
#[derive(Deserialize)]
#[serde(try_from = "Reference")]
struct Fetch(Reference);

impl TryFrom<Reference> for Fetch {
    type Error = &'static str;
    fn try_from(reference: Reference) -> Result<Self, Self::Error> {
        Ok(Fetch(reference))
    }
}

#[allow(dead_code)]
#[derive(Deserialize)]
#[serde(try_from = "Reference")]
struct Send(Reference);

impl TryFrom<Reference> for Send {
    type Error = &'static str;
    fn try_from(reference: Reference) -> Result<Self, Self::Error> {
        match reference {
            Reference::Peers { .. } => Ok(Send(reference)),
            _ => Err("Send can only be created from Peers"),
        }
    }
}

#[allow(dead_code)]
#[derive(Deserialize)]
#[serde(try_from = "Reference")]
struct Receive(Reference);

impl TryFrom<Reference> for Receive {
    type Error = &'static str;
    fn try_from(reference: Reference) -> Result<Self, Self::Error> {
        match reference {
            Reference::Peers { strategy: Strategy::All, .. } => Ok(Receive(reference)),
            Reference::Peers { .. } => Err("Receive requires SelectionStrategy::All"),
            _ => Err("Receive can only be created from Peers"),
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
enum ModelType {
    Auto,
    Pretraining,
    CausalLm,
    MaskedLm,
    MaskGeneration,
    Seq2SeqLm,
    SequenceClassification,
    MultipleChoice,
    NextSentencePrediction,
    TokenClassification,
    QuestionAnswering,
    TextEncoding,
    DepthEstimation,
    ImageClassification,
    VideoClassification,
    KeypointDetection,
    KeypointMatching,
    ObjectDetection,
    ImageSegmentation,
    ImageToImage,
    SemanticSegmentation,
    InstanceSegmentation,
    UniversalSegmentation,
    ZeroShotImageClassification,
    ZeroShotObjectDetection,
    AudioClassification,
    AudioFrameClassification,
    Ctc,
    SpeechSeq2Seq,
    AudioXVector,
    TextToSpectrogram,
    TextToWaveform,
    AudioTokenization,
    TableQuestionAnswering,
    DocumentQuestionAnswering,
    Vison2Seq,
    ImageTextToText,
    TimeSeriesPrediction,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
enum PreprocessorType {
    Tokenizer,
    Feature,
    Image,
    Video,
    Auto,
}

/// libp2p's PeerId as its serde impl reads it from a human-readable format: a base58btc
/// string of a multihash (libp2p-identity `PeerId::from_str`, multihash `Multihash<64>`
/// `from_bytes`, unsigned-varint's minimal encoding). The bs58 crate decodes; the multihash
/// rules are restated here.
struct PeerId;

const IDENTITY: u64 = 0x00;
const SHA2_256: u64 = 0x12;
const MAX_INLINE_KEY_LENGTH: usize = 42;
const MAX_DIGEST: u64 = 64;

fn read_varint(bytes: &[u8]) -> Result<(u64, &[u8]), &'static str> {
    let mut value = 0u64;
    for (i, &b) in bytes.iter().enumerate().take(10) {
        value |= u64::from(b & 0x7f) << (i * 7);
        if b & 0x80 == 0 {
            if b == 0 && i > 0 {
                return Err("varint not minimal");
            }
            return Ok((value, &bytes[i + 1..]));
        }
        if i == 9 {
            return Err("varint overflow");
        }
    }
    Err("varint insufficient")
}

fn peer_id_from_bytes(bytes: &[u8]) -> Result<PeerId, &'static str> {
    let (code, rest) = read_varint(bytes)?;
    let (size, rest) = read_varint(rest)?;
    if size > MAX_DIGEST {
        return Err("digest too long");
    }
    if rest.len() != size as usize {
        return Err("digest length differs from its size");
    }
    match code {
        SHA2_256 => Ok(PeerId),
        IDENTITY if rest.len() <= MAX_INLINE_KEY_LENGTH => Ok(PeerId),
        _ => Err("unsupported multihash"),
    }
}

struct PeerIdVisitor;

impl<'de> Visitor<'de> for PeerIdVisitor {
    type Value = PeerId;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "valid peer id")
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<PeerId, E> {
        peer_id_from_bytes(v).map_err(|_| E::invalid_value(de::Unexpected::Bytes(v), &self))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<PeerId, E> {
        let bytes = bs58::decode(v)
            .into_vec()
            .map_err(|_| E::invalid_value(de::Unexpected::Str(v), &self))?;
        peer_id_from_bytes(&bytes).map_err(|_| E::invalid_value(de::Unexpected::Str(v), &self))
    }
}

impl<'de> Deserialize<'de> for PeerId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        if deserializer.is_human_readable() {
            deserializer.deserialize_str(PeerIdVisitor)
        } else {
            deserializer.deserialize_bytes(PeerIdVisitor)
        }
    }
}

fn unhex(line: &str) -> Option<Vec<u8>> {
    let digits = line.trim_end().as_bytes();
    if digits.len() % 2 != 0 {
        return None;
    }
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
        .collect()
}

fn judge(bytes: &[u8], actions: bool) -> Result<(), String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
    if actions {
        serde_json::from_str::<actions::JobSpec>(text).map(|_| ()).map_err(|e| e.to_string())
    } else {
        serde_json::from_str::<JobSpec>(text).map(|_| ()).map_err(|e| e.to_string())
    }
}

/// The action protocol's job types (crates/messages/src/lib.rs @3058282936): no `updates`
/// or `results` in the train config, a data slice named by a u64 hash, and the `gymnasium`
/// and `rl-trainer` executor classes. Everything else is alpha.17's, reused.
mod actions {
    use super::{Adam, Descriptor, ModelType, Nesterov, PeerId, PreprocessorType, Scheduler, Strategy};
    use serde::Deserialize;

    #[allow(dead_code)]
    #[derive(Deserialize)]
    pub struct JobSpec {
        job_id: uuid::Uuid,
        executor: Executor,
    }

    #[allow(dead_code)]
    #[derive(Deserialize)]
    #[serde(tag = "class", rename_all = "kebab-case")]
    enum Executor {
        Train(TrainExecutor),
        Aggregate(AggregateExecutor),
        Gymnasium(GymnasiumExecutor),
        RlTrainer(RlTrainerExecutor),
    }

    #[allow(dead_code)]
    #[derive(Deserialize)]
    struct TrainExecutor {
        descriptor: Descriptor,
        config: TrainExecutorConfig,
    }

    #[allow(dead_code)]
    #[derive(Deserialize)]
    struct AggregateExecutor {
        descriptor: Descriptor,
        config: AggregateExecutorConfig,
    }

    #[allow(dead_code)]
    #[derive(Deserialize)]
    struct GymnasiumExecutor {
        descriptor: Descriptor,
        config: GymnasiumExecutorConfig,
    }

    #[allow(dead_code)]
    #[derive(Deserialize)]
    struct RlTrainerExecutor {
        descriptor: Descriptor,
        config: RlTrainerExecutorConfig,
    }

    #[allow(dead_code)]
    #[derive(Deserialize)]
    struct TrainExecutorConfig {
        model: Model,
        data: Fetch,
        optimizer: Adam,
        batch_size: u32,
        preprocessor: Option<Preprocessor>,
        scheduler: Option<Scheduler>,
    }

    #[allow(dead_code)]
    #[derive(Deserialize)]
    struct AggregateExecutorConfig {
        optimizer: Nesterov,
    }

    #[allow(dead_code)]
    #[derive(Deserialize)]
    struct GymnasiumExecutorConfig {
        model: Model,
        environment: String,
    }

    #[allow(dead_code)]
    #[derive(Deserialize)]
    struct RlTrainerExecutorConfig {
        model: Model,
        optimizer: Adam,
        batch_size: u32,
        scheduler: Option<Scheduler>,
    }

    #[allow(dead_code)]
    #[derive(Deserialize)]
    #[serde(rename_all = "kebab-case")]
    struct Model {
        task: ModelType,
        artifact: Fetch,
        input_names: Vec<String>,
    }

    #[allow(dead_code)]
    #[derive(Deserialize)]
    #[serde(rename_all = "kebab-case")]
    struct Preprocessor {
        task: PreprocessorType,
        artifact: Fetch,
        input_names: Vec<String>,
    }

    #[allow(dead_code)]
    #[derive(Deserialize)]
    #[serde(tag = "type")]
    enum Reference {
        #[serde(rename = "uri")]
        Uri { value: String },
        #[serde(rename = "huggingface")]
        HuggingFace {
            repository: String,
            revision: Option<String>,
            filenames: Vec<String>,
            token: Option<String>,
        },
        #[serde(rename = "peers")]
        Peers {
            peers: Vec<PeerId>,
            strategy: Strategy,
            resource: Option<DataSlice>,
        },
        #[serde(rename = "scheduler")]
        Scheduler { peer: PeerId, dataset: String },
    }

    #[allow(dead_code)]
    #[derive(Deserialize)]
    struct DataSlice {
        dataset: String,
        hash: u64,
    }

    #[allow(dead_code)]
    #[derive(Deserialize)]
    #[serde(try_from = "Reference")]
    struct Fetch(Reference);

    impl TryFrom<Reference> for Fetch {
        type Error = &'static str;
        fn try_from(reference: Reference) -> Result<Self, Self::Error> {
            Ok(Fetch(reference))
        }
    }
}

fn main() {
    let actions = match std::env::args().nth(1).as_deref() {
        None | Some("alpha17") => false,
        Some("actions") => true,
        Some(other) => panic!("unknown generation {other}: alpha17 or actions"),
    };
    let stdin = io::stdin();
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    for line in stdin.lock().lines() {
        let line = line.expect("stdin is hex lines");
        let verdict = match unhex(&line) {
            None => "error\tline is not hex".to_string(),
            Some(bytes) => match judge(&bytes, actions) {
                Ok(()) => "accept".to_string(),
                Err(reason) => format!("refuse\t{}", reason.replace(['\n', '\t'], " ")),
            },
        };
        writeln!(out, "{verdict}").expect("stdout is open");
    }
}
